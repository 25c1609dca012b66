package main

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"samplerd.dev/client/go/internal/testserver"
)

var target string

func TestMain(m *testing.M) { os.Exit(testserver.Run(m, &target)) }

var tokensLine = regexp.MustCompile(`(?m)^tokens: \[([0-9 ]*)\]$`)

// tokens runs the example with args and returns the token ids it printed.
func tokens(t *testing.T, args ...string) []int {
	t.Helper()
	var out bytes.Buffer
	if err := run(append([]string{"-target=" + target}, args...), &out); err != nil {
		t.Fatalf("run(%v): %v\n%s", args, err, out.String())
	}
	m := tokensLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no tokens line in:\n%s", out.String())
	}
	var ids []int
	for _, f := range strings.Fields(m[1]) {
		id, err := strconv.Atoi(f)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func TestExamplePrintsOneTokenPerRowAndShmAgreesWithInline(t *testing.T) {
	args := []string{"-batch=3", "-vocab=500", "-seed=5", "-top_k=20"}
	inline := tokens(t, args...)
	if len(inline) != 3 {
		t.Fatalf("got %d tokens %v, want 3", len(inline), inline)
	}
	for _, id := range inline {
		if id < 0 || id >= 500 {
			t.Errorf("token %d outside [0, 500)", id)
		}
	}
	if shm := tokens(t, append(args, "-shm")...); fmt.Sprint(shm) != fmt.Sprint(inline) {
		t.Errorf("-shm printed %v, inline %v; want the same", shm, inline)
	}
}

func TestExampleReportsServerErrors(t *testing.T) {
	var out bytes.Buffer
	err := run([]string{"-target=" + target, "-top_p=1.5", "-vocab=10"}, &out)
	if err == nil || !strings.Contains(err.Error(), "InvalidArgument: expected params[0].top_p in (0, 1], got 1.5") {
		t.Errorf("got %v, want the server's INVALID_ARGUMENT", err)
	}
}
