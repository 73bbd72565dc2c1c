package main

import (
	"bufio"
	"context"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/uptrace/bun/driver/pgdriver"
)

// ImportScenario is the name of the import scenario (docs/api-contract.md §15): -import-rows
// active rows uploaded in one POST /imports into the benchmarked newsletter, timed until the
// import has completed.
const ImportScenario = "import_1m"

// ImportRecord is the import scenario's result.
type ImportRecord struct {
	Rows          int64   `json:"rows"`
	UploadSeconds float64 `json:"upload_seconds"`
	Seconds       float64 `json:"seconds"`
	RowsPerSec    float64 `json:"rows_per_sec"`
	Created       int64   `json:"created"`
	PeakRSSMiB    float64 `json:"peak_rss_mib,omitempty"`
	// CopySeconds is the baseline: COPY of the same file into a bare table.
	CopySeconds float64 `json:"copy_seconds,omitempty"`
}

// importFile writes the scenario's CSV file of rows active rows, addresses unique to run.
func importFile(w io.Writer, run string, rows int) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	fmt.Fprintln(bw, "email,name")
	for i := range rows {
		fmt.Fprintf(bw, "imp-%s-%d@example.com,Imported %d\n", run, i, i)
	}
	return bw.Flush()
}

// runImport runs the import scenario and records it in the report.
func (b *bench) runImport(ctx context.Context) error {
	rows := b.cfg.importRows
	run := strings.ToLower(b.cfg.runID)
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(importFile(pw, run, rows)) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(b.cfg.url, "/")+"/api/v1/imports", pr)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+b.cfg.key)
	req.Header.Set("Content-Type", "text/csv")
	stopRSS := b.sampleRSS()
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		stopRSS()
		return fmt.Errorf("%s: upload: %w", ImportScenario, err)
	}
	var created struct {
		Data struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	err = json.NewDecoder(res.Body).Decode(&created)
	res.Body.Close()
	if res.StatusCode != http.StatusAccepted || err != nil {
		stopRSS()
		return fmt.Errorf("%s: upload answered %d (%v)", ImportScenario, res.StatusCode, err)
	}
	rec := ImportRecord{Rows: int64(rows), UploadSeconds: time.Since(start).Seconds()}
	for {
		time.Sleep(200 * time.Millisecond)
		imp, err := b.getImport(ctx, created.Data.ID)
		if err != nil {
			stopRSS()
			return err
		}
		if imp.State == "completed" || imp.State == "cancelled" {
			rec.Created = imp.Counts.Created
			break
		}
	}
	rec.Seconds = time.Since(start).Seconds()
	rec.RowsPerSec = float64(rows) / rec.Seconds
	rec.PeakRSSMiB = stopRSS()
	if b.db != nil {
		d, err := b.copyBaseline(ctx, run, rows)
		if err != nil {
			return err
		}
		rec.CopySeconds = d.Seconds()
	}
	b.rep.Import = &rec
	fmt.Fprintf(b.log, "%s: %d rows in %.1fs (%.0f rows/s; upload %.1fs), %d created, peak RSS %.0f MiB; COPY baseline %.1fs\n",
		ImportScenario, rows, rec.Seconds, rec.RowsPerSec, rec.UploadSeconds, rec.Created, rec.PeakRSSMiB, rec.CopySeconds)
	return nil
}

type importState struct {
	State  string `json:"state"`
	Counts struct {
		Created int64 `json:"created"`
	} `json:"counts"`
}

func (b *bench) getImport(ctx context.Context, id string) (importState, error) {
	var out struct {
		Data importState `json:"data"`
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(b.cfg.url, "/")+"/api/v1/imports/"+id, nil)
	if err != nil {
		return out.Data, err
	}
	req.Header.Set("Authorization", "Bearer "+b.cfg.key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return out.Data, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return out.Data, fmt.Errorf("%s: GET import answered %d", ImportScenario, res.StatusCode)
	}
	return out.Data, json.NewDecoder(res.Body).Decode(&out)
}

// copyBaseline COPYs the same file into a bare table and drops it: what the database itself
// needs to take the rows in.
func (b *bench) copyBaseline(ctx context.Context, run string, rows int) (time.Duration, error) {
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	table := "bench_import_copy"
	if _, err := conn.ExecContext(ctx, "CREATE TEMP TABLE "+table+" (email text, name text)"); err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(importFile(pw, run, rows)) }()
	start := time.Now()
	_, err = pgdriver.CopyFrom(ctx, conn, pr, "COPY "+table+" FROM STDIN (FORMAT csv, HEADER true)")
	d := time.Since(start)
	if err != nil {
		conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the connection is spent
		return 0, fmt.Errorf("%s: COPY baseline: %w", ImportScenario, err)
	}
	_, err = conn.ExecContext(ctx, "DROP TABLE "+table)
	return d, err
}

// sampleRSS samples the service's resident set size (VmRSS) every 100 ms until the returned
// function is called, which returns the peak in MiB (0 without -pid).
func (b *bench) sampleRSS() func() float64 {
	if b.cfg.pid <= 0 {
		return func() float64 { return 0 }
	}
	done := make(chan struct{})
	peak := make(chan int64, 1)
	go func() {
		var max int64
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if kb := vmRSS(b.cfg.pid); kb > max {
				max = kb
			}
			select {
			case <-done:
				peak <- max
				return
			case <-t.C:
			}
		}
	}()
	return func() float64 {
		close(done)
		return float64(<-peak) / 1024
	}
}

// vmRSS is process pid's VmRSS in KiB, or 0.
func vmRSS(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
