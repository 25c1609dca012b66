package samplerd

import (
	"context"

	"samplerd.dev/client/go/samplerdv1"
)

// Sample samples one token per row of logits, a row-major [batch, vocab] fp32 tensor
// (batch*vocab values) sent inline. opts set the sampling parameters (see SampleOption).
// Returns INVALID_ARGUMENT without calling the server when the shape or a parameter's number
// of values is wrong; otherwise the server's answer or error (*Error). Costs one copy of the
// logits into the message.
func (c *Client) Sample(ctx context.Context, logits []float32, batch, vocab int,
	opts ...SampleOption) (*Result, error) {
	t, err := FP32Tensor(logits, batch, vocab)
	if err != nil {
		return nil, err
	}
	return c.SampleTensor(ctx, t, opts...)
}

// SampleTensor samples one token per row of t: inline bytes of any dtype, or a region slice.
// The server validates the tensor (dtype, shape, byte count, region bounds).
func (c *Client) SampleTensor(ctx context.Context, t Tensor, opts ...SampleOption) (*Result, error) {
	req, err := NewRequest(t, opts...)
	if err != nil {
		return nil, err
	}
	return c.SampleRequest(ctx, req)
}

// SampleRequest sends a prepared request (see NewRequest), for fields this package has no
// option for (output regions, IPC events).
func (c *Client) SampleRequest(ctx context.Context, req *samplerdv1.SampleRequest) (*Result, error) {
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	resp, err := c.stub.Sample(ctx, req)
	if err != nil {
		return nil, fromRPC(err)
	}
	return newResult(resp), nil
}

// NewRequest builds the SampleRequest for t and opts. It checks only the number of values of
// each per-row parameter (1 or t.Batch), the number of rows and words of the logits
// processors (processors.go) and that the strings are UTF-8 (protobuf cannot send others),
// returning INVALID_ARGUMENT otherwise.
func NewRequest(t Tensor, opts ...SampleOption) (*samplerdv1.SampleRequest, error) {
	var cfg sampleConfig
	for _, opt := range opts {
		opt(&cfg)
	}
	strs := []struct{ field, value string }{
		{"request_id", cfg.requestID}, {"device", cfg.device}, {"logits.region", t.Region},
		{"token_bitmask.region", cfg.bitmaskRegion.GetRegion()},
		{"logit_bias.region", cfg.biasRegion.GetRegion()},
		{"token_history.region", cfg.historyRegion.GetRegion()},
	}
	for _, s := range strs {
		if err := checkUTF8(s.field, s.value, true); err != nil {
			return nil, err
		}
	}
	params, err := cfg.params(t.Batch)
	if err != nil {
		return nil, err
	}
	req := &samplerdv1.SampleRequest{
		RequestId: cfg.requestID,
		Logits:    t.proto(),
		Params:    params,
		Device:    cfg.device,
		Logprobs:  cfg.logprobs,
	}
	if err := cfg.setProcessors(req, t.Batch, t.Vocab); err != nil {
		return nil, err
	}
	return req, nil
}
