package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"

	"github.com/subscriberd/subscriberd/internal/metricnames"
)

// grafanaVars replaces Grafana's variables by values that keep the PromQL valid.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${datasource}", "prometheus", "$job", "subscriberd", "$instance", ".*",
)

// counterLike are the series suffixes whose raw value means nothing: they must be read
// through rate(), irate() or increase().
var counterLike = []string{"_total", "_count", "_sum", "_bucket"}

// knownMetrics is every series name a query may use: what the service exports
// (metricnames.Names), what the rules record, and Prometheus' own "up".
func knownMetrics(t *testing.T) map[string]bool {
	t.Helper()
	known := map[string]bool{"up": true}
	for _, n := range metricnames.Names() {
		known[n] = true
	}
	for _, r := range loadRules(t) {
		if r.Record != "" {
			known[r.Record] = true
		}
	}
	return known
}

// checkQuery parses expr (after Grafana variable substitution) and reports every problem:
// syntax, unknown metric names, counters read without rate/increase.
func checkQuery(expr string, known map[string]bool) []string {
	ast, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return []string{"does not parse: " + err.Error()}
	}
	var problems []string
	parser.Inspect(ast, func(n parser.Node, path []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		if name == "" {
			problems = append(problems, "a selector without a metric name: "+vs.String())
			return nil
		}
		if !known[name] {
			problems = append(problems, "names "+name+", which subscriberd does not export")
		}
		if slices.ContainsFunc(counterLike, func(s string) bool { return strings.HasSuffix(name, s) }) &&
			!strings.Contains(name, ":") && !insideRate(path) {
			problems = append(problems, name+" is a counter read without rate() or increase()")
		}
		return nil
	})
	return problems
}

func insideRate(path []parser.Node) bool {
	for _, n := range path {
		if c, ok := n.(*parser.Call); ok && slices.Contains([]string{"rate", "irate", "increase"}, c.Func.Name) {
			return true
		}
	}
	return false
}

type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Datasource  *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Targets []struct {
		Expr     string `json:"expr"`
		Exemplar bool   `json:"exemplar"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's panels
}

func TestDashboards(t *testing.T) {
	files, err := filepath.Glob("grafana/dashboards/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards found (err %v)", err)
	}
	known := knownMetrics(t)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			raw, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			var d dashboard
			if err := json.Unmarshal(raw, &d); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			if d.UID == "" || d.Title == "" {
				t.Errorf("uid %q, title %q: both are needed for provisioning and links", d.UID, d.Title)
			}
			var vars []string
			for _, v := range d.Templating.List {
				vars = append(vars, v.Name)
			}
			for _, want := range []string{"datasource", "job", "instance"} {
				if !slices.Contains(vars, want) {
					t.Errorf("no $%s variable (have %v)", want, vars)
				}
			}
			queries, exemplarPanels := 0, 0
			var walk func([]panel)
			walk = func(ps []panel) {
				for _, p := range ps {
					if p.Type == "row" {
						walk(p.Panels)
						continue
					}
					if p.Title == "" || p.Description == "" || p.FieldConfig.Defaults.Unit == "" {
						t.Errorf("panel %q: needs a title, a description and a unit", p.Title)
					}
					if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
						t.Errorf("panel %q: datasource must be ${datasource}", p.Title)
					}
					hasExemplar, quantile := false, false
					for _, tg := range p.Targets {
						queries++
						hasExemplar = hasExemplar || tg.Exemplar
						quantile = quantile || strings.Contains(tg.Expr, "histogram_quantile")
						for _, prob := range checkQuery(tg.Expr, known) {
							t.Errorf("panel %q: %s\n\tquery: %s", p.Title, prob, tg.Expr)
						}
						if strings.Contains(tg.Expr, "[") && !strings.Contains(tg.Expr, "[$__rate_interval]") {
							t.Errorf("panel %q: range selectors should use $__rate_interval: %s", p.Title, tg.Expr)
						}
					}
					if hasExemplar {
						exemplarPanels++
					}
					if quantile && !hasExemplar {
						t.Errorf("latency panel %q shows no exemplars, so it cannot link to traces", p.Title)
					}
				}
			}
			walk(d.Panels)
			if queries == 0 || exemplarPanels == 0 {
				t.Errorf("%d queries, %d panels with exemplars: the dashboard is empty or cannot reach traces", queries, exemplarPanels)
			}
		})
	}
}

// The checker itself must catch what it is for.
func TestCheckQueryCatchesMistakes(t *testing.T) {
	known := map[string]bool{"email_sends_total": true}
	for expr, want := range map[string]string{
		`sum(rate(email_sends_total[$__rate_interval]))`:     "",
		`sum(rate(email_sends_total[$__rate_interval])`:      "does not parse",
		`sum(rate(email_send_total[$__rate_interval]))`:      "does not export",
		`sum(email_sends_total)`:                             "without rate",
		`sum(rate({__name__=~"email.*"}[$__rate_interval]))`: "without a metric name",
	} {
		got := strings.Join(checkQuery(expr, known), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkQuery(%s) = %q, want a problem containing %q", expr, got, want)
		}
	}
}

type rule struct {
	Record      string            `yaml:"record"`
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

func loadRules(t *testing.T) []rule {
	t.Helper()
	raw, err := os.ReadFile("prometheus/rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatal("rules.yml has no rules")
	}
	return rules
}

// Every rule names only exported metrics, and every alert has a severity, a summary and a
// runbook_url whose anchor is a heading of docs/operating.md.
func TestRulesMatchServiceAndRunbooks(t *testing.T) {
	known := knownMetrics(t)
	doc, err := os.ReadFile("../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(string(doc), -1) {
		anchors[githubAnchor(m[1])] = true
	}
	alerts := 0
	for _, r := range loadRules(t) {
		name := r.Record + r.Alert
		for _, prob := range checkQuery(r.Expr, known) {
			t.Errorf("rule %s: %s", name, prob)
		}
		if r.Alert == "" {
			continue
		}
		alerts++
		if sev := r.Labels["severity"]; sev != "page" && sev != "ticket" {
			t.Errorf("alert %s: severity %q, want page or ticket", name, sev)
		}
		if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
			t.Errorf("alert %s: needs a summary and a description", name)
		}
		url := r.Annotations["runbook_url"]
		_, anchor, ok := strings.Cut(url, "docs/operating.md#")
		if !ok || !anchors[anchor] {
			t.Errorf("alert %s: runbook_url %q does not point at a heading of docs/operating.md", name, url)
		}
	}
	if alerts < 10 {
		t.Errorf("%d alerts; the SLO and cause alerts are missing", alerts)
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// The compose stack's Prometheus loads the rules and scrapes the admin port, and every file
// docker-compose.yml mounts exists.
func TestComposeWiring(t *testing.T) {
	var prom struct {
		RuleFiles []string `yaml:"rule_files"`
		Global    struct {
			ScrapeNativeHistograms bool `yaml:"scrape_native_histograms"`
		} `yaml:"global"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			ScrapeNative  *bool  `yaml:"scrape_native_histograms"`
			ScrapeClassic bool   `yaml:"always_scrape_classic_histograms"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, "prometheus/prometheus.yml", &prom)
	if !slices.Equal(prom.RuleFiles, []string{"rules.yml"}) {
		t.Errorf("rule_files = %v, want [rules.yml] (mounted beside the config)", prom.RuleFiles)
	}
	var target string
	for _, sc := range prom.ScrapeConfigs {
		if sc.JobName == "subscriberd" && sc.MetricsPath == "/metrics" && len(sc.StaticConfigs) == 1 {
			target = strings.Join(sc.StaticConfigs[0].Targets, ",")
			// A histogram exposed both ways loses its classic series to the native one unless
			// the job keeps them, and the rules and dashboards read only classic series.
			native := prom.Global.ScrapeNativeHistograms
			if sc.ScrapeNative != nil {
				native = *sc.ScrapeNative
			}
			if native && !sc.ScrapeClassic {
				t.Error("job subscriberd scrapes native histograms without always_scrape_classic_histograms: " +
					"Prometheus would drop the _bucket, _count and _sum series the rules and dashboards read")
			}
		}
	}
	if target != "subscriberd:9090" {
		t.Errorf("scrape target of job subscriberd = %q, want the service's ADMIN_ADDR subscriberd:9090", target)
	}

	var compose struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
		} `yaml:"services"`
	}
	readYAML(t, "../docker-compose.yml", &compose)
	svc := compose.Services["subscriberd"]
	if svc.Environment["ADMIN_ADDR"] != ":9090" || svc.Environment["SMTP_URL"] != "smtp://mailpit:1025" {
		t.Errorf("subscriberd environment = %v", svc.Environment)
	}
	lgtm := compose.Services["lgtm"]
	mounts := map[string]string{}
	for _, v := range lgtm.Volumes {
		src, dst, ok := strings.Cut(v, ":")
		if !ok || !strings.HasPrefix(src, "./") {
			continue
		}
		dst, _, _ = strings.Cut(dst, ":")
		mounts[dst] = src
		if _, err := os.Stat(filepath.Join("..", src)); err != nil {
			t.Errorf("lgtm mounts %s, which does not exist", src)
		}
	}
	if mounts["/otel-lgtm/prometheus.yaml"] != "./deploy/prometheus/prometheus.yml" ||
		mounts["/otel-lgtm/rules.yml"] != "./deploy/prometheus/rules.yml" {
		t.Errorf("lgtm mounts %v: the config and the rules must sit side by side in /otel-lgtm", mounts)
	}
	for name, s := range compose.Services {
		if s.Image == "" || strings.HasSuffix(s.Image, ":latest") || !strings.Contains(s.Image, ":") {
			t.Errorf("service %s: image %q is not pinned to a tag", name, s.Image)
		}
	}
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
