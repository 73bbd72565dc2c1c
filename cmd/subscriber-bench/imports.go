package main

import (
	"bufio"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/procfs"
	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/driver/pgdriver"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/baseline"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
)

// ImportScenario is the name of the import scenario (docs/api-contract.md §15): -import-rows
// active rows uploaded in one POST /imports into the benchmarked newsletter, timed until the
// import has completed.
const ImportScenario = "import_1m"

// ImportRecord is the import scenario's result.
type ImportRecord struct {
	// Variant is "" for the scenario itself (active rows, no webhook endpoint), "webhook" with
	// one endpoint subscribed to every event (delivered meanwhile by the service), and
	// "pending_10pct" with every tenth row pending (its confirmation email queued).
	Variant       string  `json:"variant,omitempty"`
	Rows          int64   `json:"rows"`
	UploadSeconds float64 `json:"upload_seconds"`
	Seconds       float64 `json:"seconds"`
	RowsPerSec    float64 `json:"rows_per_sec"`
	Created       int64   `json:"created"`
	PeakRSSMiB    float64 `json:"peak_rss_mib,omitempty"`
	// CopySeconds is the baseline: COPY of the same file into a bare table.
	CopySeconds float64 `json:"copy_seconds,omitempty"`
	// InsertSelectSeconds is the other baseline: the copied rows made subscribers by one
	// INSERT … SELECT into a bare table shaped as subscribers (its columns, keys and indexes;
	// no triggers, events or foreign keys).
	InsertSelectSeconds float64 `json:"insert_select_seconds,omitempty"`
	// started is when the upload began: the rows were created after it.
	started time.Time
}

// Import variants (ImportRecord.Variant).
const (
	importWebhook = "webhook"
	importPending = "pending_10pct"
)

// importFile writes the variant's CSV file of rows rows, addresses unique to run: all active,
// or every tenth pending for importPending. The scenario's own file (variant "") also has the
// §19 columns, filled on few rows so that the import stays comparable with the earlier plain
// ones: every hundredth row (i % 100 == 42) has tag svc.FilteredTag and the attribute plan
// svc.FilteredPlan, 1 % each, which list_tag and list_attr select; each of the first 100 rows
// has tag svc.TagName(i), so that the newsletter has 100 tags (tags_list); the other rows have
// none of either (an empty cell sets nothing).
func importFile(w io.Writer, run string, rows int, variant string) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	tagged := variant == ""
	if tagged {
		fmt.Fprintln(bw, "email,name,status,tags,attributes.plan")
	} else {
		fmt.Fprintln(bw, "email,name,status")
	}
	for i := range rows {
		status := "active"
		if variant == importPending && i%10 == 0 {
			status = "pending"
		}
		fmt.Fprintf(bw, "imp-%s-%d@example.com,Imported %d,%s", run, i, i, status)
		if tagged {
			var tag, plan string
			if i < svc.ImportTags {
				tag = svc.TagName(i)
			}
			if i%100 == 42 {
				tag, plan = svc.FilteredTag, svc.FilteredPlan
			}
			fmt.Fprintf(bw, ",%s,%s", tag, plan)
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// runImports runs the import scenario, then its variants with a webhook endpoint and with
// 10 % pending rows, each into the benchmarked newsletter with addresses of its own.
func (b *bench) runImports(ctx context.Context) error {
	plain, err := b.runImport(ctx, "")
	if err != nil {
		return err
	}
	if b.db != nil {
		cp, ins, err := b.copyBaseline(ctx, strings.ToLower(b.cfg.runID), int(plain.Rows))
		if err != nil {
			return err
		}
		plain.CopySeconds, plain.InsertSelectSeconds = cp.Seconds(), ins.Seconds()
		fmt.Fprintf(b.log, "%s: COPY of the same file into a bare table %.1fs, then INSERT … SELECT of its rows into a bare subscribers table %.1fs\n",
			ImportScenario, plain.CopySeconds, plain.InsertSelectSeconds)
	}
	b.rep.Import = &plain
	if err := b.runTagReads(ctx); err != nil {
		return err
	}
	if err := b.runBulk(ctx, plain.started); err != nil {
		return err
	}
	rc, err := startReceiver(b.cfg.webhookReceiver)
	if err != nil {
		return err
	}
	defer rc.Close()
	if remove, err := b.addEndpoint(ctx, rc); err != nil {
		fmt.Fprintf(b.log, "note: %s with a webhook endpoint not measured (does the service run with WEBHOOK_ALLOW_PRIVATE=true?): %v\n", ImportScenario, err)
	} else {
		hooked, err := b.runImport(ctx, importWebhook)
		remove()
		if err != nil {
			return err
		}
		b.rep.ImportVariants = append(b.rep.ImportVariants, hooked)
	}
	// A single create in another newsletter once the import has queued half its emails.
	single, err := b.startSingles(ctx)
	if err != nil {
		return err
	}
	defer single.close()
	half := int64(b.cfg.importRows / 20)
	wait := b.singleDuring(ctx, single, ImportScenario+variantSuffix(importPending),
		func() bool { return b.bulkEmailsQueued(ctx) >= half }, func() bool { return b.bulkEmailsQueued(ctx) > 0 })
	pending, err := b.runImport(ctx, importPending)
	b.addSingle(wait())
	if err != nil {
		return err
	}
	b.rep.ImportVariants = append(b.rep.ImportVariants, pending)
	// Its emails go out at the SMTP receiver's pace (100 to 200 a second here): only a run that
	// measures more after it (-scale-to) waits for them, up to -drain-timeout.
	if b.db != nil && b.cfg.scaleTo > 0 {
		t0 := time.Now()
		n, left, err := b.waitDrained(ctx, "email_outbox")
		if err == nil {
			fmt.Fprintf(b.log, "%s%s: %d confirmation emails pending after it, %d left %.1fs later\n",
				ImportScenario, variantSuffix(importPending), n, left, time.Since(t0).Seconds())
		}
	}
	return nil
}

// runImport uploads one import file of the variant and waits for the import to complete.
func (b *bench) runImport(ctx context.Context, variant string) (ImportRecord, error) {
	rows := b.cfg.importRows
	run := strings.ToLower(b.cfg.runID)
	if variant != "" {
		run += "-" + variant
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(importFile(pw, run, rows, variant)) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(b.cfg.url, "/")+"/api/v1/imports", pr)
	if err != nil {
		return ImportRecord{}, err
	}
	req.Header.Set("Authorization", "Bearer "+b.cfg.key)
	req.Header.Set("Content-Type", "text/csv")
	stopRSS := b.sampleRSS()
	start := time.Now()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		stopRSS()
		return ImportRecord{}, fmt.Errorf("%s: upload: %w", ImportScenario, err)
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
		return ImportRecord{}, fmt.Errorf("%s: upload answered %d (%v)", ImportScenario, res.StatusCode, err)
	}
	rec := ImportRecord{Variant: variant, Rows: int64(rows), UploadSeconds: time.Since(start).Seconds(), started: start}
	for {
		time.Sleep(200 * time.Millisecond)
		imp, err := b.client.GetImport(ctx, created.Data.ID)
		if err != nil {
			stopRSS()
			return ImportRecord{}, fmt.Errorf("%s: %w", ImportScenario, err)
		}
		if imp.State == "completed" || imp.State == "cancelled" {
			rec.Created = imp.Counts.Created
			break
		}
	}
	rec.Seconds = time.Since(start).Seconds()
	rec.RowsPerSec = float64(rows) / rec.Seconds
	rec.PeakRSSMiB = stopRSS()
	fmt.Fprintf(b.log, "%s%s: %d rows in %.1fs (%.0f rows/s; upload %.1fs), %d created, peak RSS %.0f MiB\n",
		ImportScenario, variantSuffix(variant), rows, rec.Seconds, rec.RowsPerSec, rec.UploadSeconds, rec.Created, rec.PeakRSSMiB)
	return rec, nil
}

// variantSuffix names an import variant after the scenario's name: "", or " (webhook)".
func variantSuffix(variant string) string {
	if variant == "" {
		return ""
	}
	return " (" + variant + ")"
}

// copyBaseline COPYs the same file into a bare table, then makes its rows subscribers of the
// newsletter with one INSERT … SELECT into a bare table shaped as subscribers (LIKE …
// INCLUDING ALL: columns, defaults, keys and indexes, no triggers or foreign keys), and drops
// both: what the database itself needs to take the rows in, and to store them as subscribers.
func (b *bench) copyBaseline(ctx context.Context, run string, rows int) (cp, ins time.Duration, err error) {
	// A pool of its own: the baseline pool's reads time out after pgdriver's 10 s, and one
	// INSERT of a million rows takes longer.
	db := bun.NewDB(sql.OpenDB(pgdriver.NewConnector(pgdriver.WithDSN(b.cfg.databaseURL),
		pgdriver.WithReadTimeout(10*time.Minute), pgdriver.WithApplicationName(baseline.ApplicationName))), pgdialect.New())
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	table, subs := "bench_import_copy", "bench_import_subscribers"
	if _, err := conn.ExecContext(ctx, "CREATE TEMP TABLE "+table+" (email text, name text, status text, tags text, plan text)"); err != nil {
		return 0, 0, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(importFile(pw, run, rows, "")) }()
	start := time.Now()
	_, err = pgdriver.CopyFrom(ctx, conn, pr, "COPY "+table+" FROM STDIN (FORMAT csv, HEADER true)")
	cp = time.Since(start)
	if err != nil {
		conn.Raw(func(any) error { return driver.ErrBadConn }) //nolint:errcheck // the connection is spent
		return 0, 0, fmt.Errorf("%s: COPY baseline: %w", ImportScenario, err)
	}
	// A table of its own, logged as subscribers is, so that the newsletter's list is not
	// changed for the variants that follow.
	if _, err := conn.ExecContext(ctx, "CREATE TABLE "+subs+" (LIKE subscribers INCLUDING ALL)"); err != nil {
		return 0, 0, err
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+subs) //nolint:errcheck // best effort
	start = time.Now()
	_, err = conn.ExecContext(ctx, `INSERT INTO `+subs+` (id, newsletter_id, email, email_key, first_name, last_name, status, created_at, updated_at, tags, attributes)
SELECT gen_random_uuid(), ?, email, lower(email), split_part(name, ' ', 1), substr(name, length(split_part(name, ' ', 1)) + 2),
    status, now(), now(), coalesce(string_to_array(tags, ','), '{}'),
    CASE WHEN plan IS NULL THEN '{}' ELSE jsonb_build_object('plan', plan) END
FROM `+table+`
ON CONFLICT (newsletter_id, email_key) DO NOTHING`, b.rep.Meta.Newsletter)
	ins = time.Since(start)
	if err != nil {
		return 0, 0, fmt.Errorf("%s: INSERT … SELECT baseline: %w", ImportScenario, err)
	}
	_, err = conn.ExecContext(ctx, "DROP TABLE "+table)
	return cp, ins, err
}

// sampleRSS samples the service's resident set size (VmRSS) every 100 ms until the returned
// function is called, which returns the peak in MiB (0 without -pid).
func (b *bench) sampleRSS() func() float64 {
	done, peak := make(chan struct{}), make(chan int64)
	go func() {
		var kb int64
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			kb = max(kb, vmRSS(b.cfg.pid)) // 0 without -pid
			select {
			case <-done:
				peak <- kb
				return
			case <-tick.C:
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
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0
	}
	st, err := p.NewStatus()
	if err != nil {
		return 0
	}
	return int64(st.VmRSS >> 10)
}
