// Package config reads the settings every assay service shares from the
// environment, with flags mirroring it, and refuses bad values at start-up
// with an error that names the setting.
package config

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/event"
)

// DefaultRegions are the regions an installation knows when ASSAY_REGIONS
// is unset.
var DefaultRegions = []string{"us", "eu"}

// Config holds the shared settings. Zero values are filled by Load with the
// defaults given on each field.
type Config struct {
	// Regions are the regions this installation knows (ASSAY_REGIONS, comma
	// separated). Default us,eu. A tenant's home region is one of them.
	Regions []string
	// Region is the region this instance serves (ASSAY_REGION), one of
	// Regions. Required.
	Region string
	// Cell is the cell this instance serves (ASSAY_CELL): its streams,
	// subjects and durables are named by it. Default the region's name; a
	// region that outgrows one database may hold several cells.
	Cell string
	// Installation prefixes every stream, subject and durable
	// (ASSAY_INSTALLATION), so several installations can share one NATS
	// cluster. Default assay.
	Installation string
	// Streams configure the streams this instance creates:
	// ASSAY_STREAM_REPLICAS (default 1), ASSAY_STREAM_MAX_AGE (default
	// 168h), ASSAY_STREAM_PLACEMENT (comma-separated server tags, default
	// none).
	Streams event.StreamSettings
	// DatabaseURL is the cell's Postgres (ASSAY_DATABASE_URL). Required.
	DatabaseURL string
	// NATSURL is the cell's NATS (ASSAY_NATS_URL). Default nats://127.0.0.1:4222.
	NATSURL string
	// ModelBaseURL is the OpenAI-compatible endpoint (ASSAY_MODEL_BASE_URL),
	// without the /v1 suffix. Required by the classifier only.
	ModelBaseURL string
	// ModelAPIKey is sent as a bearer token (ASSAY_MODEL_API_KEY). Optional.
	ModelAPIKey string
	// Model is the model name sent on every call (ASSAY_MODEL). Required by
	// the classifier: there is no default model of a real endpoint.
	Model string
	// HTTPAddr is where the service serves its API, /healthz, /readyz and
	// /metrics (ASSAY_HTTP_ADDR). Default given by the service.
	HTTPAddr string
}

// Setting describes one setting: its variable, its flag and its field.
type setting struct {
	env, flag, usage string
	field            func(*Config) *string
}

// raw holds the settings that are parsed after they are read.
type raw struct {
	regions, replicas, maxAge, placement string
}

var settings = []setting{
	{"ASSAY_REGION", "region", "region served by this instance (one of ASSAY_REGIONS)", func(c *Config) *string { return &c.Region }},
	{"ASSAY_CELL", "cell", "cell served by this instance (default: the region)", func(c *Config) *string { return &c.Cell }},
	{"ASSAY_INSTALLATION", "installation", "prefix of every stream, subject and durable (default assay)", func(c *Config) *string { return &c.Installation }},
	{"ASSAY_DATABASE_URL", "database-url", "the cell's Postgres URL", func(c *Config) *string { return &c.DatabaseURL }},
	{"ASSAY_NATS_URL", "nats-url", "NATS URL", func(c *Config) *string { return &c.NATSURL }},
	{"ASSAY_MODEL_BASE_URL", "model-base-url", "OpenAI-compatible endpoint, with or without /v1", func(c *Config) *string { return &c.ModelBaseURL }},
	{"ASSAY_MODEL_API_KEY", "model-api-key", "bearer token for the model endpoint", func(c *Config) *string { return &c.ModelAPIKey }},
	{"ASSAY_MODEL", "model", "model name", func(c *Config) *string { return &c.Model }},
	{"ASSAY_HTTP_ADDR", "http-addr", "listen address for HTTP", func(c *Config) *string { return &c.HTTPAddr }},
}

// Need says which optional settings a service requires.
type Need struct {
	Model    bool
	HTTPAddr string // default listen address
}

var rawSettings = []struct {
	env, flag, usage string
	field            func(*raw) *string
}{
	{"ASSAY_REGIONS", "regions", "regions of the installation, comma separated (default us,eu)", func(r *raw) *string { return &r.regions }},
	{"ASSAY_STREAM_REPLICAS", "stream-replicas", "replicas of the streams this instance creates: 1 to 5 (default 1)", func(r *raw) *string { return &r.replicas }},
	{"ASSAY_STREAM_MAX_AGE", "stream-max-age", "history the streams keep for replay, a Go duration (default 168h)", func(r *raw) *string { return &r.maxAge }},
	{"ASSAY_STREAM_PLACEMENT", "stream-placement", "server tags the streams are placed by, comma separated (default none)", func(r *raw) *string { return &r.placement }},
}

// Load reads the environment through getenv, then the flags in args (flags
// win), applies defaults and validates.
func Load(name string, args []string, getenv func(string) string, need Need) (Config, error) {
	var c Config
	var r raw
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	for _, s := range settings {
		p := s.field(&c)
		*p = getenv(s.env)
		fs.StringVar(p, s.flag, *p, s.usage+" ($"+s.env+")")
	}
	for _, s := range rawSettings {
		p := s.field(&r)
		*p = getenv(s.env)
		fs.StringVar(p, s.flag, *p, s.usage+" ($"+s.env+")")
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("config: unexpected argument %q", fs.Arg(0))
	}
	var errs []error
	c.Regions, c.Streams, errs = r.parse()
	if c.Cell == "" {
		c.Cell = c.Region
	}
	if c.NATSURL == "" {
		c.NATSURL = "nats://127.0.0.1:4222"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = need.HTTPAddr
	}
	if c.Installation == "" {
		c.Installation = event.DefaultInstallation
	}
	return c, c.validate(need, errs)
}

// parse reads the list and stream settings; each error names its variable.
func (r raw) parse() (regions []string, st event.StreamSettings, errs []error) {
	regions = DefaultRegions
	if r.regions != "" {
		var err error
		if regions, err = ParseRegions(r.regions); err != nil {
			errs = append(errs, fmt.Errorf("ASSAY_REGIONS: %w", err))
		}
	}
	if r.replicas != "" {
		n, err := strconv.Atoi(r.replicas)
		if err != nil || n < 1 || n > 5 {
			errs = append(errs, fmt.Errorf("ASSAY_STREAM_REPLICAS: %q is not a whole number from 1 to 5", r.replicas))
		}
		st.Replicas = n
	}
	if r.maxAge != "" {
		d, err := time.ParseDuration(r.maxAge)
		if err != nil || d < time.Hour || d > 366*24*time.Hour {
			errs = append(errs, fmt.Errorf("ASSAY_STREAM_MAX_AGE: %q is not a duration from 1h to 8784h", r.maxAge))
		}
		st.MaxAge = d
	}
	for _, tag := range strings.Split(r.placement, ",") {
		if tag = strings.TrimSpace(tag); tag != "" {
			st.Placement = append(st.Placement, tag)
		}
	}
	return regions, st, errs
}

// ParseRegions reads a comma-separated list of region names: subject
// tokens, at least one, none twice.
func ParseRegions(list string) ([]string, error) {
	var out []string
	for _, r := range strings.Split(list, ",") {
		r = strings.TrimSpace(r)
		if !event.ValidToken(r) {
			return nil, fmt.Errorf("%q is not a region name (lower-case letters, digits, hyphens)", r)
		}
		if slices.Contains(out, r) {
			return nil, fmt.Errorf("region %q is listed twice", r)
		}
		out = append(out, r)
	}
	return out, nil
}

// Names are the NATS names of the cell this instance serves.
func (c Config) Names() event.Names {
	return event.Names{Installation: c.Installation, Cell: c.Cell}
}

func (c Config) validate(need Need, errs []error) error {
	if err := ValidateRegion(c.Regions, c.Region); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_REGION: %w", err))
	}
	if !event.ValidToken(c.Cell) && c.Region != "" {
		errs = append(errs, fmt.Errorf("ASSAY_CELL: %q is not a cell id (lower-case letters, digits, hyphens)", c.Cell))
	}
	if !event.ValidToken(c.Installation) {
		errs = append(errs, fmt.Errorf("ASSAY_INSTALLATION: %q is not an installation name (lower-case letters, digits, hyphens)", c.Installation))
	}
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("ASSAY_DATABASE_URL: required"))
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_DATABASE_URL: cannot parse: %s", redact(err.Error(), c.DatabaseURL)))
	}
	if u, err := url.Parse(c.NATSURL); err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
		errs = append(errs, fmt.Errorf("ASSAY_NATS_URL: %q is not a nats:// or tls:// URL", Redacted(c.NATSURL)))
	}
	if need.Model {
		if c.ModelBaseURL == "" {
			errs = append(errs, errors.New("ASSAY_MODEL_BASE_URL: required"))
		} else if u, err := url.Parse(c.ModelBaseURL); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Errorf("ASSAY_MODEL_BASE_URL: %q is not an http(s) URL", Redacted(c.ModelBaseURL)))
		}
		if c.Model == "" {
			errs = append(errs, errors.New("ASSAY_MODEL: required: the model name the endpoint serves (e.g. gpt-4o-mini)"))
		}
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("ASSAY_HTTP_ADDR: %q: %v", c.HTTPAddr, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("config: %w", errors.Join(errs...))
	}
	return nil
}

// ValidateRegion accepts only a region of the installation's.
func ValidateRegion(regions []string, r string) error {
	if r == "" {
		return errors.New("required")
	}
	if !slices.Contains(regions, r) {
		return fmt.Errorf("unknown region %q (known: %s; ASSAY_REGIONS sets them)", r, strings.Join(regions, ", "))
	}
	return nil
}

// Invalid marks err as a bad setting: the process that meets it stops at
// start-up with exit code 2.
func Invalid(err error) error {
	if err == nil {
		return nil
	}
	return invalidError{err}
}

// IsInvalid reports whether err is, or wraps, a bad setting.
func IsInvalid(err error) bool {
	var ie invalidError
	return errors.As(err, &ie)
}

type invalidError struct{ error }

func (e invalidError) Unwrap() error { return e.error }

// redact keeps a password out of an error message.
// Redacted is a URL setting fit for a message: each of its comma-separated
// URLs with any password replaced (url.URL.Redacted), and one that does not
// parse named only as such.
func Redacted(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "(a value that does not parse as a URL)"
			continue
		}
		parts[i] = u.Redacted()
	}
	return strings.Join(parts, ",")
}

func redact(msg, rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// Int reads the variable name, when it is set, as a whole number from min
// to max into to. The error names the variable.
func Int(getenv func(string) string, name string, to *int, min, max int) error {
	v := getenv(name)
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min || n > max {
		return fmt.Errorf("%s: %q is not a whole number from %d to %d", name, v, min, max)
	}
	*to = n
	return nil
}

// Duration is one duration setting a service reads from the environment.
type Duration struct {
	Name     string         // the variable, e.g. ASSAY_LEASE_TTL
	To       *time.Duration // set when the variable is
	Min, Max time.Duration  // the accepted range
}

// Durations reads each variable that is set as a Go duration (e.g. 30s)
// within its range. The error names the variable.
func Durations(getenv func(string) string, ds ...Duration) error {
	for _, d := range ds {
		v := getenv(d.Name)
		if v == "" {
			continue
		}
		dur, err := time.ParseDuration(v)
		if err != nil || dur < d.Min || dur > d.Max {
			return fmt.Errorf("%s: %q is not a duration from %s to %s", d.Name, v, d.Min, d.Max)
		}
		*d.To = dur
	}
	return nil
}
