package samplerd

import (
	"encoding/binary"
	"math"
	"unsafe"

	"samplerd.dev/client/go/samplerdv1"
)

// DType is the element type of a logits tensor.
type DType = samplerdv1.DType

const (
	// FP32 is IEEE 754 binary32, 4 bytes per element.
	FP32 = samplerdv1.DType_DTYPE_FP32
	// FP16 is IEEE 754 binary16, 2 bytes per element.
	FP16 = samplerdv1.DType_DTYPE_FP16
	// BF16 is bfloat16 (the top 16 bits of a binary32), 2 bytes per element.
	BF16 = samplerdv1.DType_DTYPE_BF16
)

// DTypeSize is the byte size of one element of d, 0 for an unknown type.
func DTypeSize(d DType) int {
	switch d {
	case FP32:
		return 4
	case FP16, BF16:
		return 2
	}
	return 0
}

// Tensor is a row-major [Batch, Vocab] logits tensor: inline little-endian bytes (Data), or a
// slice of a registered region (Region, Offset). Client.SampleTensor sends it as is: the server
// checks that the byte count matches the shape.
type Tensor struct {
	// DType is the element type.
	DType DType
	// Batch is the number of rows B >= 1; Vocab the vocabulary size V >= 1.
	Batch, Vocab int
	// RowStride is the number of elements between the starts of consecutive rows; 0 means
	// Vocab (dense). Inline data then holds (Batch-1)*RowStride + Vocab elements.
	RowStride int
	// Data holds the inline elements, little-endian. Leave it nil when Region is set.
	Data []byte
	// Region names a registered region that holds the elements, at byte Offset.
	Region string
	// Offset is the byte offset of the first element inside Region.
	Offset uint64
}

// FP32Tensor returns an inline Tensor over logits ([batch, vocab] row-major, batch*vocab
// long). On little-endian machines Data aliases logits (no copy): do not change logits while
// a call that uses the Tensor runs. Returns INVALID_ARGUMENT for a wrong length.
func FP32Tensor(logits []float32, batch, vocab int) (Tensor, error) {
	if err := checkShape(len(logits), batch, vocab); err != nil {
		return Tensor{}, err
	}
	return Tensor{DType: FP32, Batch: batch, Vocab: vocab, Data: float32Bytes(logits)}, nil
}

// checkShape checks that n elements form a [batch, vocab] tensor.
func checkShape(n, batch, vocab int) error {
	if batch < 1 || vocab < 1 {
		return invalidArgument("expected batch >= 1 and vocab >= 1, got batch %d and vocab %d",
			batch, vocab)
	}
	if n/vocab != batch || n%vocab != 0 {
		return invalidArgument("expected batch * vocab = %d * %d logits, got %d", batch, vocab, n)
	}
	return nil
}

// proto returns the tensor as its message.
func (t *Tensor) proto() *samplerdv1.Tensor {
	m := &samplerdv1.Tensor{
		Dtype:     t.DType,
		Shape:     []int64{int64(t.Batch), int64(t.Vocab)},
		RowStride: int64(t.RowStride),
	}
	if t.Region != "" {
		m.Data = &samplerdv1.Tensor_Region{
			Region: &samplerdv1.RegionSlice{Region: t.Region, Offset: t.Offset},
		}
	} else {
		m.Data = &samplerdv1.Tensor_InlineData{InlineData: t.Data}
	}
	return m
}

// littleEndian is whether this machine stores numbers little-endian, as the wire format does.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// float32Bytes returns v as little-endian bytes: a view of v's memory on little-endian
// machines (no copy), a converted copy elsewhere.
func float32Bytes(v []float32) []byte {
	if len(v) == 0 {
		return []byte{}
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
	}
	out := make([]byte, 4*len(v))
	for i, f := range v {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(f))
	}
	return out
}

// putFloat32s writes v into dst (at least 4*len(v) bytes) as little-endian fp32.
func putFloat32s(dst []byte, v []float32) {
	if littleEndian {
		copy(dst, float32Bytes(v))
		return
	}
	for i, f := range v {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
	}
}
