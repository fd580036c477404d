// promcheck checks what drafs ships for Prometheus with Prometheus's own
// parsers:
//
//	promcheck exposition < METRICS   parses a /metrics page (the text format);
//	                                 prints each family as "name type"
//	promcheck rules < RULES.json     loads a PrometheusRule's spec (JSON) as
//	                                 Prometheus loads a rule file (unknown
//	                                 fields, PromQL, durations, annotation
//	                                 templates); prints each alert and the
//	                                 metric names its expr selects
//	promcheck exprs < EXPRS          one PromQL expression per line (a
//	                                 dashboard's); prints the metric names
//
// Any parse error exits 1 with the parser's message.
package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) != 2 {
		fail("usage: promcheck exposition|rules|exprs < INPUT")
	}
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail(err.Error())
	}
	switch os.Args[1] {
	case "exposition":
		exposition(string(in))
	case "rules":
		rules(in)
	case "exprs":
		for _, line := range strings.Split(string(in), "\n") {
			if strings.TrimSpace(line) != "" {
				fmt.Println(strings.Join(selected(line), " "))
			}
		}
	default:
		fail("unknown mode " + os.Args[1])
	}
}

func exposition(text string) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		fail("exposition: " + err.Error())
	}
	names := make([]string, 0, len(families))
	for name := range families {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Printf("%s %s\n", name, strings.ToLower(families[name].GetType().String()))
	}
}

func rules(in []byte) {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	spec, errs := rulefmt.Parse(in, false, model.UTF8Validation, parser.NewParser(parser.Options{}), logger)
	if len(errs) > 0 {
		fail(fmt.Sprintf("rules: %v", errs))
	}
	for _, g := range spec.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			fmt.Printf("%s %s\n", name, strings.Join(selected(r.Expr), " "))
		}
	}
}

// selected parses expr and returns the metric names its vector selectors name.
func selected(expr string) []string {
	parsed, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		fail(fmt.Sprintf("%q: %v", expr, err))
	}
	seen := map[string]bool{}
	parser.Inspect(parsed, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok {
			for _, m := range vs.LabelMatchers {
				if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
					seen[m.Value] = true
				}
			}
		}
		return nil
	})
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "promcheck:", msg)
	os.Exit(1)
}
