package samplerd

import (
	"encoding/binary"
	"math"
	"sort"

	"samplerd.dev/client/go/samplerdv1"
)

// The logits processors of a request (proto/samplerd/v1/processors.proto). The server applies
// them per row, before temperature and every filter: the logit bias, then the repetition,
// presence and frequency penalties on the row's token history, then the allowed-token bitmask
// (docs/DESIGN.md, "Logits processors"). Each is optional. This package checks what only it
// can see (counts of rows and words) and refuses those requests with INVALID_ARGUMENT before
// sending; the server checks the rest (token ids in [0, V), penalty ranges) with its own
// messages.

// processorConfig collects the processor options of one request.
type processorConfig struct {
	repetition, presence, frequency []float32

	bitmaskWords  []int32 // flat [B * ceil(V/32)]
	bitmaskRows   [][]int32
	bitmaskRegion *samplerdv1.RegionSlice

	biasAll    map[int32]float32 // one map for every row
	biasRows   []map[int32]float32
	biasRegion *samplerdv1.RegionSlice

	history        bool // TokenHistory was given
	prompt, output [][]int32
	historyRegion  *samplerdv1.RegionSlice
}

// BitmaskWords is the number of int32 words per row of a bitmask for vocab tokens,
// ceil(vocab / 32).
func BitmaskWords(vocab int) int { return (vocab + 31) / 32 }

// TokenBitmask allows only some tokens in each row: words holds the int32 words [B,
// ceil(V/32)] row-major (B * BitmaskWords(V) values), bit t%32 of word t/32 of a row set when
// token t is allowed. This is the layout of xgrammar and vLLM. A token whose bit is clear
// becomes -inf; a row left with nothing allowed gets RowInvalidNoAllowed and token -1. Bits past
// V are ignored. The words are copied into the request.
func TokenBitmask(words []int32) SampleOption {
	return func(c *sampleConfig) { c.bitmaskWords, c.bitmaskRows, c.bitmaskRegion = words, nil, nil }
}

// TokenBitmaskRows is TokenBitmask with one slice of BitmaskWords(V) words per row.
func TokenBitmaskRows(rows [][]int32) SampleOption {
	return func(c *sampleConfig) { c.bitmaskWords, c.bitmaskRows, c.bitmaskRegion = nil, rows, nil }
}

// TokenBitmaskRegion reads the bitmask's words (as TokenBitmask lays them out) from a
// registered region at byte offset (aligned to 4): host shm, or GPU IPC memory on the logits'
// device, so that a grammar engine's mask is not copied.
func TokenBitmaskRegion(region string, offset uint64) SampleOption {
	return func(c *sampleConfig) {
		c.bitmaskWords, c.bitmaskRows = nil, nil
		c.bitmaskRegion = &samplerdv1.RegionSlice{Region: region, Offset: offset}
	}
}

// LogitBias adds bias[t] to the logit of token t in every row (OpenAI's logit_bias); +Inf
// forces a token, -Inf bans it.
func LogitBias(bias map[int32]float32) SampleOption {
	return func(c *sampleConfig) { c.biasAll, c.biasRows, c.biasRegion = bias, nil, nil }
}

// LogitBiasRows is LogitBias with one map per row (B maps; nil for a row without bias).
func LogitBiasRows(rows []map[int32]float32) SampleOption {
	return func(c *sampleConfig) { c.biasAll, c.biasRows, c.biasRegion = nil, rows, nil }
}

// LogitBiasRegion reads the logit-bias lists from a registered region (host shm, or GPU IPC
// memory on the logits' device) at byte offset (aligned to 4), packed as PackLogitBias lays
// them out, so that an engine rewrites them in place each step instead of sending them. The
// server reads B + 1 row offsets there, then the N = row_offsets[B] entries; a region too small
// for them is OUT_OF_RANGE.
func LogitBiasRegion(region string, offset uint64) SampleOption {
	return func(c *sampleConfig) {
		c.biasAll, c.biasRows = nil, nil
		c.biasRegion = &samplerdv1.RegionSlice{Region: region, Offset: offset}
	}
}

// PackLogitBias returns rows (one map per row, nil for a row without bias) packed as a region
// holds them for LogitBiasRegion (processors.proto, LogitBias.region), little-endian:
// uint32 row_offsets[B + 1], int32 token_ids[N], float32 biases[N], each row's tokens in
// increasing order, as LogitBiasRows sends them: (B + 1 + 2N) * 4 bytes.
func PackLogitBias(rows []map[int32]float32) []byte {
	return packLogitBias(logitBiasRows(rows))
}

// RepetitionPenalty sets vLLM's repetition penalty r > 0 (1 is off): the logit x of every token
// in the row's prompt or output (TokenHistory) becomes x / r when x > 0, else x * r.
func RepetitionPenalty(r ...float32) SampleOption {
	return func(c *sampleConfig) { c.repetition = given(r) }
}

// PresencePenalty sets p in [-2, 2]: p is subtracted from the logit of every token that occurs
// in the row's output (TokenHistory).
func PresencePenalty(p ...float32) SampleOption {
	return func(c *sampleConfig) { c.presence = given(p) }
}

// FrequencyPenalty sets f in [-2, 2]: f times the token's count in the row's output
// (TokenHistory) is subtracted from its logit.
func FrequencyPenalty(f ...float32) SampleOption {
	return func(c *sampleConfig) { c.frequency = given(f) }
}

// TokenHistory gives the tokens the penalties act on: per row, the prompt's token ids and the
// output's so far (B slices each; either may be nil for none, as may a row). The request
// carries each row's distinct tokens with their output count and whether the prompt has them.
func TokenHistory(prompt, output [][]int32) SampleOption {
	return func(c *sampleConfig) {
		c.history, c.prompt, c.output, c.historyRegion = true, prompt, output, nil
	}
}

// TokenHistoryRegion reads the token history from a registered region (host shm, or GPU IPC
// memory on the logits' device) at byte offset (aligned to 4), packed as PackTokenHistory lays
// it out. Read like LogitBiasRegion.
func TokenHistoryRegion(region string, offset uint64) SampleOption {
	return func(c *sampleConfig) {
		c.history, c.prompt, c.output = false, nil, nil
		c.historyRegion = &samplerdv1.RegionSlice{Region: region, Offset: offset}
	}
}

// PackTokenHistory returns the history of TokenHistory(prompt, output) packed as a region holds
// it for TokenHistoryRegion (processors.proto, TokenHistory.region), little-endian: uint32
// row_offsets[B + 1], int32 token_ids[N], uint32 output_counts[N], uint8 in_prompt[N] (0 or
// 1), each row's distinct tokens in increasing order: (B + 1 + 2N) * 4 + N bytes. B is the
// number of rows of prompt and output (either may be nil); INVALID_ARGUMENT when both are
// given with different numbers of rows.
func PackTokenHistory(prompt, output [][]int32) ([]byte, error) {
	batch := len(prompt)
	if prompt == nil {
		batch = len(output)
	} else if output != nil && len(output) != batch {
		return nil, invalidArgument(
			"expected prompt and output token ids for the same number of rows, got %d and %d",
			len(prompt), len(output))
	}
	h, err := tokenHistory(prompt, output, batch)
	if err != nil {
		return nil, err
	}
	return packTokenHistory(h), nil
}

// setProcessors writes the processors of c into req, for logits of batch rows and vocab
// tokens. Returns INVALID_ARGUMENT for a bitmask with the wrong number of words or per-row
// values with the wrong number of rows.
func (c *processorConfig) setProcessors(req *samplerdv1.SampleRequest, batch, vocab int) error {
	mask, err := c.bitmask(batch, vocab)
	if err != nil {
		return err
	}
	req.TokenBitmask = mask
	if req.LogitBias, err = c.logitBias(batch); err != nil {
		return err
	}
	switch {
	case c.historyRegion != nil:
		req.TokenHistory = &samplerdv1.TokenHistory{Region: c.historyRegion}
	case c.history:
		req.TokenHistory, err = tokenHistory(c.prompt, c.output, batch)
	}
	return err
}

func (c *processorConfig) bitmask(batch, vocab int) (*samplerdv1.TokenBitmask, error) {
	if c.bitmaskRegion != nil {
		return &samplerdv1.TokenBitmask{Data: &samplerdv1.TokenBitmask_Region{Region: c.bitmaskRegion}}, nil
	}
	words := BitmaskWords(vocab)
	rows := c.bitmaskRows
	switch {
	case c.bitmaskWords != nil:
		if len(c.bitmaskWords) != batch*words {
			return nil, invalidArgument("expected a token bitmask of B * ceil(V / 32) = %d * %d words, got %d",
				batch, words, len(c.bitmaskWords))
		}
		rows = [][]int32{c.bitmaskWords}
	case rows == nil:
		return nil, nil
	case len(rows) != batch:
		return nil, invalidArgument("expected a token bitmask of B = %d rows, got %d", batch, len(rows))
	}
	data := make([]byte, 0, 4*batch*words)
	for i, row := range rows {
		if c.bitmaskRows != nil && len(row) != words {
			return nil, invalidArgument("expected ceil(V / 32) = %d bitmask words in row %d, got %d",
				words, i, len(row))
		}
		for _, w := range row {
			data = binary.LittleEndian.AppendUint32(data, uint32(w))
		}
	}
	return &samplerdv1.TokenBitmask{Data: &samplerdv1.TokenBitmask_InlineWords{InlineWords: data}}, nil
}

func (c *processorConfig) logitBias(batch int) (*samplerdv1.LogitBias, error) {
	rows := c.biasRows
	switch {
	case c.biasRegion != nil:
		return &samplerdv1.LogitBias{Region: c.biasRegion}, nil
	case c.biasAll != nil:
		rows = make([]map[int32]float32, batch)
		for i := range rows {
			rows[i] = c.biasAll
		}
	case rows == nil:
		return nil, nil
	case len(rows) != batch:
		return nil, invalidArgument("expected logit bias for B = %d rows, got %d", batch, len(rows))
	}
	return logitBiasRows(rows), nil
}

// logitBiasRows packs one map per row: each row's tokens in increasing order.
func logitBiasRows(rows []map[int32]float32) *samplerdv1.LogitBias {
	out := &samplerdv1.LogitBias{RowOffsets: make([]uint32, 1, len(rows)+1)}
	for _, row := range rows {
		for _, t := range sortedKeys(row) {
			out.TokenIds = append(out.TokenIds, t)
			out.Biases = append(out.Biases, row[t])
		}
		out.RowOffsets = append(out.RowOffsets, uint32(len(out.TokenIds)))
	}
	return out
}

// tokenHistory packs B prompts and outputs: each row's distinct tokens in increasing order.
func tokenHistory(prompt, output [][]int32, batch int) (*samplerdv1.TokenHistory, error) {
	for _, h := range []struct {
		name string
		rows [][]int32
	}{{"prompt", prompt}, {"output", output}} {
		if h.rows != nil && len(h.rows) != batch {
			return nil, invalidArgument("expected %s token ids for B = %d rows, got %d", h.name, batch, len(h.rows))
		}
	}
	out := &samplerdv1.TokenHistory{RowOffsets: make([]uint32, 1, batch+1)}
	for i := 0; i < batch; i++ {
		counts := map[int32]uint32{}
		inPrompt := map[int32]bool{}
		if prompt != nil {
			for _, t := range prompt[i] {
				counts[t] += 0 // an entry, with the output's count (if any) added below
				inPrompt[t] = true
			}
		}
		if output != nil {
			for _, t := range output[i] {
				counts[t]++
			}
		}
		for _, t := range sortedKeys(counts) {
			out.TokenIds = append(out.TokenIds, t)
			out.OutputCounts = append(out.OutputCounts, counts[t])
			out.InPrompt = append(out.InPrompt, inPrompt[t])
		}
		out.RowOffsets = append(out.RowOffsets, uint32(len(out.TokenIds)))
	}
	return out, nil
}

// packLogitBias lays out the lists of b as LogitBias.region holds them.
func packLogitBias(b *samplerdv1.LogitBias) []byte {
	out := make([]byte, 0, 4*(len(b.RowOffsets)+2*len(b.TokenIds)))
	for _, o := range b.RowOffsets {
		out = binary.LittleEndian.AppendUint32(out, o)
	}
	for _, t := range b.TokenIds {
		out = binary.LittleEndian.AppendUint32(out, uint32(t))
	}
	for _, v := range b.Biases {
		out = binary.LittleEndian.AppendUint32(out, math.Float32bits(v))
	}
	return out
}

// packTokenHistory lays out the lists of h as TokenHistory.region holds them.
func packTokenHistory(h *samplerdv1.TokenHistory) []byte {
	out := make([]byte, 0, 4*(len(h.RowOffsets)+2*len(h.TokenIds))+len(h.TokenIds))
	for _, o := range h.RowOffsets {
		out = binary.LittleEndian.AppendUint32(out, o)
	}
	for _, t := range h.TokenIds {
		out = binary.LittleEndian.AppendUint32(out, uint32(t))
	}
	for _, n := range h.OutputCounts {
		out = binary.LittleEndian.AppendUint32(out, n)
	}
	for _, p := range h.InPrompt {
		if p {
			out = append(out, 1)
		} else {
			out = append(out, 0)
		}
	}
	return out
}

// sortedKeys returns the keys of m in increasing order (requests do not depend on map order).
func sortedKeys[V any](m map[int32]V) []int32 {
	keys := make([]int32, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}
