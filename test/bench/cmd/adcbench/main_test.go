package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCreateReportKeepsEarlierReports(t *testing.T) {
	dir := t.TempDir()
	first := filepath.Join(dir, "2026-11-26-small.md")
	if err := os.WriteFile(first, []byte("earlier run"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2026-11-26-small-2.md", "2026-11-26-small-3.md"} {
		out, err := createReport(dir, "2026-11-26-small")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := out.WriteString("new run"); err != nil {
			t.Fatal(err)
		}
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
		if got := filepath.Base(out.Name()); got != want {
			t.Errorf("report written to %s, want %s", got, want)
		}
	}
	if b, err := os.ReadFile(first); err != nil || string(b) != "earlier run" {
		t.Errorf("earlier report = %q, %v; want it kept", b, err)
	}
}
