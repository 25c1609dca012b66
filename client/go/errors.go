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
// package made them for a request it refused to send or for a local failure. Every error this
// package returns is one. Use errors.As to get one, or status.Code(err) for the code alone.
//
// A local failure of the operating system (opening, sizing or mapping a host shm object:
// RESOURCE_EXHAUSTED, as the C++ client reports a host shm object it cannot make; unmapping
// or unlinking one: INTERNAL) wraps the OS error, so that errors.Is(err, fs.ErrExist) or
// errors.As(err, &errno) (a syscall.Errno) reach it; Message then ends with its text.
type Error struct {
	// Code is the gRPC status code.
	Code codes.Code
	// Message is the status message, without the code.
	Message string

	cause error // the OS error of a local failure, or nil
}

// Error returns "samplerd: CODE: message".
func (e *Error) Error() string {
	return fmt.Sprintf("samplerd: %s: %s", e.Code, e.Message)
}

// Unwrap returns the OS error of a local failure, or nil.
func (e *Error) Unwrap() error { return e.cause }

// GRPCStatus returns the error as a gRPC status, so that status.Code and status.FromError see
// the server's code.
func (e *Error) GRPCStatus() *status.Status {
	return status.New(e.Code, e.Message)
}

// invalidArgument is an error for a request this package refuses to send.
func invalidArgument(format string, args ...interface{}) *Error {
	return &Error{Code: codes.InvalidArgument, Message: fmt.Sprintf(format, args...)}
}

// localError is a local failure of the operating system: code, the message "expected
// <expected>, got <op>: <cause>", and cause to unwrap.
func localError(code codes.Code, cause error, expected, op string) *Error {
	message := fmt.Sprintf("expected %s, got %s: %v", expected, op, cause)
	return &Error{Code: code, Message: message, cause: cause}
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
