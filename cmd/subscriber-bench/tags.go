package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/baseline"
	"github.com/subscriberd/subscriberd/cmd/subscriber-bench/svc"
	"github.com/subscriberd/subscriberd/model"
	"github.com/subscriberd/subscriberd/repo"
)

// The attributes-and-tags reads (docs/api-contract.md §19.4) run on the newsletter right after
// the million-row import, whose file tags and plans its rows (importFile): list_tag and
// list_attr against their baselines, the service's own statement run bare
// (repo.FilteredListPostgres, the statement the service sends, through the same driver), and
// tags_list against its latency target. create_attrs runs with the other writes (plan).
const (
	baseListTag  = "list_tag_sql"
	baseListAttr = "list_attr_sql"
	// tagsListP99Ms is tags_list's target: p99 ≤ 50 ms.
	tagsListP99Ms = 50
)

// filteredReads are list_tag and list_attr: the list query the service makes of each request
// (what api makes of ?tag= and ?attr[plan]=), for its baseline and EXPLAIN.
var filteredReads = []struct {
	service, baseline string
	filter            model.Filter
}{
	{svc.ListTag, baseListTag, model.Filter{Tags: []string{svc.FilteredTag}}},
	{svc.ListAttr, baseListAttr, model.Filter{Attributes: []model.AttributeCondition{{Key: "plan", Value: svc.FilteredPlan}}}},
}

// ExplainRecord is EXPLAIN (ANALYZE, BUFFERS) of a scenario's statement, run once after its
// measured runs: SQL is the statement with its values bound as the service sends it.
type ExplainRecord struct {
	Scenario string   `json:"scenario"`
	SQL      string   `json:"sql"`
	Plan     []string `json:"plan"`
}

// TagsRecord describes the newsletter the attributes-and-tags reads ran on.
type TagsRecord struct {
	Subscribers int64 `json:"subscribers"`
	// Tagged and Planned hold svc.FilteredTag and plan=svc.FilteredPlan; Tags is how many tags
	// the newsletter has.
	Tagged   int64           `json:"tagged"`
	Planned  int64           `json:"planned"`
	Tags     int64           `json:"tags"`
	Explains []ExplainRecord `json:"explains,omitempty"`
}

// runTagReads runs list_tag, list_attr (each with its baseline and EXPLAIN) and tags_list on
// the newsletter as the import left it, after VACUUM ANALYZE (the planner's statistics must
// know the new rows' tags and attributes).
func (b *bench) runTagReads(ctx context.Context) error {
	if err := b.vacuumTables(ctx); err != nil {
		return err
	}
	rec := &TagsRecord{}
	b.rep.Tags = rec
	if b.db != nil {
		nl := b.rep.Meta.Newsletter
		_ = b.db.NewRaw(`SELECT count(*), count(*) FILTER (WHERE tags @> ARRAY[?]::text[]), count(*) FILTER (WHERE attributes @> jsonb_build_object('plan', ?::text)),
    (SELECT count(DISTINCT tag) FROM subscriber_tag_counts WHERE newsletter_id = ? AND n <> 0)
FROM subscribers WHERE newsletter_id = ?`, svc.FilteredTag, svc.FilteredPlan, nl, nl).Scan(ctx, &rec.Subscribers, &rec.Tagged, &rec.Planned, &rec.Tags)
		fmt.Fprintf(b.log, "attributes and tags: %d subscribers, %d with tag %s, %d with plan=%s, %d tags\n",
			rec.Subscribers, rec.Tagged, svc.FilteredTag, rec.Planned, svc.FilteredPlan, rec.Tags)
	}
	for _, f := range filteredReads {
		b.runService(ctx, f.service, b.cfg.clients, b.cfg.warmup, b.cfg.duration, "measure", 0)
		if b.base == nil {
			continue
		}
		query, args := repo.FilteredListPostgres(b.base.Newsletter, model.ListQuery{Page: 1, Limit: baseline.PageSize, Filter: f.filter})
		b.runBaselineScenario(ctx, b.base.Statement(f.baseline, "the service's own statement of "+f.service+", run bare", query, args...), b.cfg.clients, 0)
		ex, err := b.explain(ctx, f.service, query, args)
		if err != nil {
			return err
		}
		rec.Explains = append(rec.Explains, ex)
	}
	b.runService(ctx, svc.TagsList, b.cfg.clients, b.cfg.warmup, b.cfg.duration, "measure", 0)
	return nil
}

// explain runs EXPLAIN (ANALYZE, BUFFERS) of query with args bound as the service binds them.
func (b *bench) explain(ctx context.Context, scenario, query string, args []any) (ExplainRecord, error) {
	ex := ExplainRecord{Scenario: scenario, SQL: b.db.NewRaw(query, args...).String()}
	if err := b.db.NewRaw("EXPLAIN (ANALYZE, BUFFERS) "+query, args...).Scan(ctx, &ex.Plan); err != nil {
		return ex, fmt.Errorf("EXPLAIN of %s: %w", scenario, err)
	}
	return ex, nil
}

// tagsMarkdown is the attributes-and-tags section: the four scenarios against their targets,
// and the plans of the filtered lists.
func tagsMarkdown(w io.Writer, rep *Report) {
	t := rep.Tags
	create := rep.comparison(svc.CreateAttrs)
	if t == nil && create == nil {
		return
	}
	fmt.Fprint(w, "\nAttributes and tags (§19.4): create_attrs ran with the other writes, against create_active in alternating slices.")
	if t != nil {
		fmt.Fprintf(w, " list_tag, list_attr and tags_list ran on the newsletter right after the import above: %d subscribers, "+
			"%d with tag `%s`, %d with attribute plan = `%s`, %d tags. Each filtered list's baseline is the service's own "+
			"statement (one statement: the exact total and the page) sent bare through the same driver at the same "+
			"concurrency, its values bound as the service binds them; the indexes are the schema's partial GIN indexes. "+
			"A cost of at most 1.5 × the bare statement is a ratio of at least 0.67.",
			t.Subscribers, t.Tagged, svc.FilteredTag, t.Planned, svc.FilteredPlan, t.Tags)
	}
	fmt.Fprint(w, "\n\n")
	tableHead(w)
	for _, name := range []string{svc.ListTag, svc.ListAttr, svc.CreateAttrs} {
		comparisonRow(w, rep, name)
	}
	if s := rep.find("service", svc.TagsList, "measure", rep.Meta.Clients); s != nil {
		fmt.Fprintf(w, "| %s | %s | %s | %s | | | | | | p99 ≤ %d ms | %s |\n", svc.TagsList, f1(s.RequestsPerSec), f2(s.P50Ms), f2(s.P99Ms),
			tagsListP99Ms, metWord(s.ErrorCount == 0 && s.P99Ms <= tagsListP99Ms))
	}
	if t == nil {
		return
	}
	for _, ex := range t.Explains {
		if ex.Scenario != svc.SegmentCount { // in bulkMarkdown
			explainMarkdown(w, ex)
		}
	}
}

func explainMarkdown(w io.Writer, ex ExplainRecord) {
	fmt.Fprintf(w, "\n%s: the service's statement and `EXPLAIN (ANALYZE, BUFFERS)` of it, after its runs:\n\n```sql\n%s\n```\n\n```\n%s\n```\n",
		ex.Scenario, ex.SQL, strings.Join(ex.Plan, "\n"))
}

// tableHead and comparisonRow are the table of a scenario against its target ratio.
func tableHead(w io.Writer) {
	fmt.Fprintln(w, "| scenario | req/s | p50 | p99 | against | req/s | p50 | p99 | ratio | target | verdict |")
	fmt.Fprintln(w, "|---|--:|--:|--:|---|--:|--:|--:|--:|---|---|")
}

func comparisonRow(w io.Writer, rep *Report, name string) {
	c := rep.comparison(name)
	s := rep.find("service", name, "measure", rep.Meta.Clients)
	if c == nil || s == nil {
		return
	}
	b := rep.find("baseline", c.Baseline, "measure", rep.Meta.Clients)
	if b == nil {
		b = rep.find("service", c.Baseline, "measure", rep.Meta.Clients)
	}
	against := c.Baseline
	if c.alternated() {
		against += " (alternating, median of passes)"
	}
	fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, f1(c.Value), f2(s.P50Ms), f2(s.P99Ms),
		against, f1(c.Base), f2(b.P50Ms), f2(b.P99Ms), f2(c.Ratio), c.Target, metWord(c.Met != nil && *c.Met))
}

// comparison is rep's comparison of scenario with its first baseline, or nil.
func (rep *Report) comparison(scenario string) *Comparison {
	for i := range rep.Comparisons {
		if rep.Comparisons[i].Service == scenario {
			return &rep.Comparisons[i]
		}
	}
	return nil
}
