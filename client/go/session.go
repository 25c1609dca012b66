package samplerd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"samplerd.dev/client/go/samplerdv1"
)

// Session is one SampleStream call for a decode loop: one Sample per step, answered in the
// order sent. Open one per engine (or per scheduler loop) and keep it for its lifetime. Steps
// from several goroutines are serialised, one at a time.
type Session struct {
	stream     samplerdv1.SamplerService_SampleStreamClient
	cancel     context.CancelFunc
	chunkBytes int
	maxBytes   int // the client's WithMaxMessageBytes

	mu  sync.Mutex
	err error // set once the session is closed or broken; returned by later steps
}

// errSessionClosed is returned by steps after Close.
var errSessionClosed = &Error{Code: codes.FailedPrecondition,
	Message: "expected an open session, got a closed one"}

// OpenSession starts a SampleStream call. ctx bounds the whole session: cancelling it ends the
// stream. The server is not contacted until the first step, so a server that cannot be reached
// makes that step fail (UNAVAILABLE).
func (c *Client) OpenSession(ctx context.Context) (*Session, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.stub.SampleStream(ctx)
	if err != nil {
		cancel()
		return nil, fromRPC(err)
	}
	return &Session{stream: stream, cancel: cancel, chunkBytes: c.opts.streamChunkBytes,
		maxBytes: c.opts.maxMessageBytes}, nil
}

// Sample sends one step with inline fp32 logits ([batch, vocab], as Client.Sample) and waits
// for its answer.
func (s *Session) Sample(logits []float32, batch, vocab int, opts ...SampleOption) (*Result, error) {
	t, err := FP32Tensor(logits, batch, vocab)
	if err != nil {
		return nil, err
	}
	return s.SampleTensor(t, opts...)
}

// SampleTensor sends one step for t (inline or a region slice) and waits for its answer.
func (s *Session) SampleTensor(t Tensor, opts ...SampleOption) (*Result, error) {
	req, err := NewRequest(t, opts...)
	if err != nil {
		return nil, err
	}
	return s.SampleRequest(req)
}

// SampleRequest sends a prepared request as the next step and waits for its answer. A step the
// server rejects returns its code and message as an *Error, and the session stays usable; so
// does a step whose message is larger than WithMaxMessageBytes (RESOURCE_EXHAUSTED, not sent:
// WithStreamChunkBytes splits such steps). A broken stream returns the call's error, and so
// does every later step.
func (s *Session) SampleRequest(req *samplerdv1.SampleRequest) (*Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if err := s.send(req); err != nil {
		if refused, ok := err.(*Error); ok {
			return nil, refused // nothing was sent: the stream is intact
		}
		return nil, s.fail(err)
	}
	reply, err := s.stream.Recv()
	if err != nil {
		return nil, s.fail(err)
	}
	if code := reply.GetStatus().GetCode(); code != int32(codes.OK) {
		return nil, &Error{Code: codes.Code(code), Message: reply.GetStatus().GetMessage()}
	}
	return newResult(reply.GetResponse()), nil
}

// send writes one step, splitting inline logits larger than chunkBytes into chunk messages.
// A first message larger than maxBytes is refused with an *Error before anything is sent:
// grpc-go would fail the whole call for it.
func (s *Session) send(req *samplerdv1.SampleRequest) error {
	data := req.GetLogits().GetInlineData()
	if s.chunkBytes <= 0 || len(data) <= s.chunkBytes {
		msg := &samplerdv1.SampleStreamRequest{Request: req}
		if err := s.checkSize(msg); err != nil {
			return err
		}
		return s.stream.Send(msg)
	}
	// The first message carries the request with the first chunk of its bytes, the following
	// ones only chunks. The chunk messages are no larger than the first.
	msg := &samplerdv1.SampleStreamRequest{Request: firstChunk(req, s.chunkBytes), MoreChunks: true}
	if err := s.checkSize(msg); err != nil {
		return err
	}
	if err := s.stream.Send(msg); err != nil {
		return err
	}
	for off := s.chunkBytes; off < len(data); off += s.chunkBytes {
		end := off + s.chunkBytes
		if end > len(data) {
			end = len(data)
		}
		msg := &samplerdv1.SampleStreamRequest{Chunk: data[off:end], MoreChunks: end < len(data)}
		if err := s.stream.Send(msg); err != nil {
			return err
		}
	}
	return nil
}

// firstChunk returns the request of a chunked step's first message: req with only the first n
// bytes of its inline logits. Every other field, the processors and those added later
// included, is req's own: shared, not copied (neither message is modified), so the logits bytes
// are not copied either. req must carry more than n bytes of inline logits.
func firstChunk(req *samplerdv1.SampleRequest, n int) *samplerdv1.SampleRequest {
	logits := shallowCopy(req.GetLogits()).(*samplerdv1.Tensor)
	logits.Data = &samplerdv1.Tensor_InlineData{InlineData: req.GetLogits().GetInlineData()[:n]}
	first := shallowCopy(req).(*samplerdv1.SampleRequest)
	first.Logits = logits
	return first
}

// shallowCopy returns a new message of m's type with m's fields and unknown fields; repeated,
// bytes and message fields share m's memory (proto.Clone would copy the logits bytes).
func shallowCopy(m proto.Message) proto.Message {
	src := m.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		dst.Set(fd, v)
		return true
	})
	dst.SetUnknown(src.GetUnknown())
	return dst.Interface()
}

// checkSize refuses a message larger than maxBytes (RESOURCE_EXHAUSTED).
func (s *Session) checkSize(msg *samplerdv1.SampleStreamRequest) error {
	if n := proto.Size(msg); s.maxBytes > 0 && n > s.maxBytes {
		return &Error{Code: codes.ResourceExhausted, Message: fmt.Sprintf(
			"expected a step message of at most %d bytes (WithMaxMessageBytes), got %d bytes "+
				"(WithStreamChunkBytes splits large steps)", s.maxBytes, n)}
	}
	return nil
}

// fail ends the session after a failed send or receive and returns the call's error.
func (s *Session) fail(err error) error {
	if errors.Is(err, io.EOF) {
		// Send reports io.EOF when the server ended the call: its status comes from Recv.
		if _, rerr := s.stream.Recv(); rerr != nil {
			err = rerr
		}
	}
	s.err = fromRPC(err)
	s.cancel()
	return s.err
}

// Close half-closes the stream, waits for the server to end it and releases it. Returns nil
// when the call ended cleanly, else its error (the same as the failed step's when the stream
// broke earlier). Closing twice is harmless.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		if s.err == errSessionClosed {
			return nil
		}
		return s.err
	}
	defer s.cancel()
	s.err = errSessionClosed
	if err := s.stream.CloseSend(); err != nil {
		return fromRPC(err)
	}
	for {
		if _, err := s.stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fromRPC(err)
		}
	}
}
