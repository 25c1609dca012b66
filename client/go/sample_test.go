package samplerd_test

import (
	"encoding/binary"
	"math"
	"testing"

	samplerd "samplerd.dev/client/go"
	"samplerd.dev/client/go/samplerdv1"
)

func TestSampleGreedyPicksArgmax(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 8, 1000
	logits := randomLogits(1, batch, vocab)
	res, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(0), samplerd.RequestID("greedy"))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "greedy", res.Tokens, argmax(logits, batch, vocab))
	if res.RequestID != "greedy" {
		t.Errorf("RequestID = %q, want %q", res.RequestID, "greedy")
	}
	if len(res.RowStatus) != batch || len(res.Seeds) != batch {
		t.Fatalf("got %d row statuses and %d seeds, want %d each", len(res.RowStatus), len(res.Seeds), batch)
	}
	for i, s := range res.RowStatus {
		if s != samplerd.RowOK {
			t.Errorf("row %d: status %v, want OK", i, s)
		}
	}
}

func TestSampleTensorBF16GreedyPicksArgmax(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 4, 333
	logits := randomLogits(2, batch, vocab)
	data := make([]byte, 2*len(logits))
	rounded := make([]float32, len(logits)) // what the server reads: the top 16 bits
	for i, v := range logits {
		top := uint16(math.Float32bits(v) >> 16)
		binary.LittleEndian.PutUint16(data[2*i:], top)
		rounded[i] = math.Float32frombits(uint32(top) << 16)
	}
	tensor := samplerd.Tensor{DType: samplerd.BF16, Batch: batch, Vocab: vocab, Data: data}
	res, err := client.SampleTensor(ctx, tensor, samplerd.Temperature(0))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "bf16 greedy", res.Tokens, argmax(rounded, batch, vocab))
}

func TestSeededTopKIsReproducibleAndStaysInTheTopK(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab, k = 16, 500, 50
	logits := randomLogits(3, batch, vocab)
	opts := []samplerd.SampleOption{samplerd.Temperature(1), samplerd.TopK(k), samplerd.Seed(1234), samplerd.Position(7)}
	a, err := client.Sample(ctx, logits, batch, vocab, opts...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Sample(ctx, logits, batch, vocab, opts...)
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "same seed and position", b.Tokens, a.Tokens)
	for r, tok := range a.Tokens {
		if a.Seeds[r] != 1234 {
			t.Errorf("row %d: seed %d, want 1234", r, a.Seeds[r])
		}
		if !contains(topIndices(logits[r*vocab:(r+1)*vocab], k), tok) {
			t.Errorf("row %d: token %d is not among the top %d", r, tok, k)
		}
	}
	c, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(1), samplerd.TopK(k),
		samplerd.Seed(1234), samplerd.Position(8))
	if err != nil {
		t.Fatal(err)
	}
	if equal(c.Tokens, a.Tokens) {
		t.Errorf("positions 7 and 8 drew the same %d tokens %v", batch, a.Tokens)
	}
}

func TestServerChosenSeedsReplayTheDraw(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 8, 200
	logits := randomLogits(4, batch, vocab)
	first, err := client.Sample(ctx, logits, batch, vocab)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Seeds) != batch {
		t.Fatalf("got %d seeds, want %d", len(first.Seeds), batch)
	}
	replay, err := client.Sample(ctx, logits, batch, vocab, samplerd.Seed(first.Seeds...))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "replayed seeds", replay.Tokens, first.Tokens)
}

func TestPerRowParameters(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 4, 300
	logits := randomLogits(5, batch, vocab)
	res, err := client.Sample(ctx, logits, batch, vocab,
		samplerd.Temperature(0, 1, 0, 1),
		samplerd.TopK(0, 1, 0, 1), // top-k 1 is greedy too
		samplerd.Seed(1, 2, 3, 4))
	if err != nil {
		t.Fatal(err)
	}
	equalTokens(t, "greedy rows", res.Tokens, argmax(logits, batch, vocab))
	for i, s := range res.Seeds {
		if s != uint64(i+1) {
			t.Errorf("Seeds = %v, want [1 2 3 4]", res.Seeds)
			break
		}
	}
	// Per-row temperature alone: rows 0 and 2 greedy, rows 1 and 3 follow their seeds. Row
	// order does not matter (batch invariance): row 1 sampled alone gives the same token.
	mixed, err := client.Sample(ctx, logits, batch, vocab,
		samplerd.Temperature(0, 1, 0, 1), samplerd.Seed(11, 12, 13, 14))
	if err != nil {
		t.Fatal(err)
	}
	alone, err := client.Sample(ctx, logits[vocab:2*vocab], 1, vocab, samplerd.Temperature(1), samplerd.Seed(12))
	if err != nil {
		t.Fatal(err)
	}
	greedy := argmax(logits, batch, vocab)
	if mixed.Tokens[0] != greedy[0] || mixed.Tokens[2] != greedy[2] || mixed.Tokens[1] != alone.Tokens[0] {
		t.Errorf("per-row temperature: got %v, want [%d %d %d ...]", mixed.Tokens, greedy[0], alone.Tokens[0], greedy[2])
	}
}

func TestLogprobs(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab, topN = 3, 200, 5
	logits := randomLogits(6, batch, vocab)
	res, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(0),
		samplerd.Logprobs(topN, samplerd.LogprobsRaw))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Logprobs) != batch {
		t.Fatalf("got %d logprob rows, want %d", len(res.Logprobs), batch)
	}
	for r, lp := range res.Logprobs {
		row := logits[r*vocab : (r+1)*vocab]
		ref := logSoftmax(row)
		if lp.SampledRank != 1 {
			t.Errorf("row %d: sampled rank %d, want 1 (greedy)", r, lp.SampledRank)
		}
		if math.Abs(float64(lp.SampledLogprob)-ref[res.Tokens[r]]) > 1e-4 {
			t.Errorf("row %d: sampled logprob %v, want %v", r, lp.SampledLogprob, ref[res.Tokens[r]])
		}
		top := topIndices(row, topN)
		equalTokens(t, "top token ids", lp.TopTokenIds, top)
		for i, id := range top {
			if math.Abs(float64(lp.TopLogprobs[i])-ref[id]) > 1e-4 {
				t.Errorf("row %d: top logprob %d = %v, want %v", r, i, lp.TopLogprobs[i], ref[id])
			}
		}
	}
	plain, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(0))
	if err != nil {
		t.Fatal(err)
	}
	if plain.Logprobs != nil {
		t.Errorf("got %d logprob rows without asking, want none", len(plain.Logprobs))
	}
}

func TestInvalidRowsDoNotDisturbTheOthers(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	const batch, vocab = 4, 50
	logits := randomLogits(7, batch, vocab)
	logits[1*vocab+17] = float32(math.NaN())
	for j := 0; j < vocab; j++ {
		logits[2*vocab+j] = float32(math.Inf(-1))
	}
	res, err := client.Sample(ctx, logits, batch, vocab, samplerd.Temperature(0))
	if err != nil {
		t.Fatal(err)
	}
	greedy := argmax(logits, batch, vocab)
	equalTokens(t, "tokens", res.Tokens, []int32{greedy[0], -1, -1, greedy[3]})
	want := []samplerd.RowStatus{samplerd.RowOK, samplerd.RowInvalidNaN, samplerd.RowInvalidNoFinite, samplerd.RowOK}
	for i := range want {
		if res.RowStatus[i] != want[i] {
			t.Fatalf("RowStatus = %v, want %v", res.RowStatus, want)
		}
	}
}

func TestServerInfo(t *testing.T) {
	client, ctx := dial(t), testContext(t)
	info, err := client.ServerInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Version == "" {
		t.Error("empty version")
	}
	if info.Backend != samplerdv1.Backend_BACKEND_CPU {
		t.Errorf("backend %v, want BACKEND_CPU (started with --backend=cpu)", info.Backend)
	}
	if len(info.Devices) == 0 {
		t.Error("no devices")
	}
	// The server's flag defaults.
	if info.Limits.MaxBatch != 4096 || info.Limits.MaxMessageBytes != samplerd.DefaultMaxMessageBytes {
		t.Errorf("limits %v, want max_batch 4096 and max_message_bytes %d", info.Limits, samplerd.DefaultMaxMessageBytes)
	}
	if info.Limits.MaxRegions != 4096 || info.Limits.MaxRegionBytes != 4<<40 {
		t.Errorf("limits %v, want max_regions 4096 and max_region_bytes 4 TiB", info.Limits)
	}
}

func contains(v []int32, x int32) bool {
	for _, y := range v {
		if y == x {
			return true
		}
	}
	return false
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
