package samplerd

import (
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is a failed samplerd call: the gRPC status code and message, as the server sent them
// (e.g. codes.InvalidArgument, "expected params[0].top_p in (0, 1], got 1.5"), or as this
// package made them for a request it refused to send. Use errors.As to get one, or
// status.Code(err) for the code alone.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message, without the code.
	Message string
}

// Error returns "samplerd: CODE: message".
func (e *Error) Error() string {
	return fmt.Sprintf("samplerd: %s: %s", e.Code, e.Message)
}

// GRPCStatus returns the error as a gRPC status, so that status.Code and status.FromError see
// the server's code.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// invalidArgument is an error for a request this package refuses to send.
func invalidArgument(format string, args ...interface{}) *Error {
	return &Error{Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// checkUTF8 refuses a string field that is not valid UTF-8: protobuf will not marshal it, and
// grpc-go would report INTERNAL "error while marshaling" without naming the field. echo puts
// the value in the message (not for shm keys, which the server never echoes either).
func checkUTF8(field, value string, echo bool) error {
	if utf8.ValidString(value) {
		return nil
	}
	if echo {
		return invalidArgument("expected %s in UTF-8, got %q", field, value)
	}
	return invalidArgument("expected %s in UTF-8, got one that is not", field)
}

// fromRPC converts an error returned by the generated stubs into an *Error (nil stays nil).
// The end of a stream (io.EOF) where a response was due becomes UNAVAILABLE.
func fromRPC(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return &Error{Code: codes.Unavailable, Message: "expected a response, got the end of the stream"}
	}
	s, _ := status.FromError(err)
	return &Error{Code: s.Code(), Message: s.Message()}
}
