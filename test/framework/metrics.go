package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// scrapeTimeout bounds one scrape, so that a hung endpoint fails the poll
// that scraped it instead of outliving its deadline.
const scrapeTimeout = 5 * time.Second

// ScrapeMetrics gets url (a /metrics endpoint) and parses the answer.
func ScrapeMetrics(ctx context.Context, url string) (Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer func() { _ = resp.Body.Close() }() // read fully below; nothing to lose
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: status %s: %s", url, resp.Status, body)
	}
	return ParseMetrics(string(body))
}

// Sample is one line of the Prometheus text format.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics are the samples of one scrape.
type Metrics []Sample

// Sum adds the values of the samples called name whose labels include
// every pair of match.
func (m Metrics) Sum(name string, match map[string]string) float64 {
	var sum float64
	for _, s := range m.Select(name, match) {
		sum += s.Value
	}
	return sum
}

// Select returns the samples called name whose labels include every pair
// of match.
func (m Metrics) Select(name string, match map[string]string) []Sample {
	var out []Sample
next:
	for _, s := range m {
		if s.Name != name {
			continue
		}
		for k, v := range match {
			if s.Labels[k] != v {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// ParseMetrics parses the Prometheus text exposition format, enough of it
// for what the controller serves: comments are skipped, timestamps ignored.
func ParseMetrics(text string) (Metrics, error) {
	var out Metrics
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %w", i+1, line, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// parseSample parses one sample line: name{k="v",...} value [timestamp].
func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	end := strings.IndexAny(line, "{ ")
	if end <= 0 {
		return s, fmt.Errorf("no value")
	}
	s.Name, line = line[:end], line[end:]
	if strings.HasPrefix(line, "{") {
		line = line[1:]
		for {
			line = strings.TrimLeft(line, ", ")
			if strings.HasPrefix(line, "}") {
				line = line[1:]
				break
			}
			eq := strings.Index(line, `="`)
			if eq <= 0 {
				return s, fmt.Errorf("malformed label")
			}
			key := line[:eq]
			value, rest, err := unquote(line[eq+1:])
			if err != nil {
				return s, err
			}
			s.Labels[key] = value
			line = rest
		}
	}
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, fmt.Errorf("value: %w", err)
	}
	s.Value = v
	return s, nil
}

// unquote reads a double-quoted label value with \\, \" and \n escapes
// from the start of s, and returns it and the rest of s.
func unquote(s string) (value, rest string, err error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			i++
			if i == len(s) {
				return "", "", fmt.Errorf("unterminated label value")
			}
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated label value")
}
