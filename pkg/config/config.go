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
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Regions are the cells assay knows. A region is a cell: its own streams and
// its own database.
var Regions = []string{"us", "eu"}

// Config holds the shared settings. Zero values are filled by Load with the
// defaults given on each field.
type Config struct {
	// Region is the cell this instance serves (ASSAY_REGION). Required.
	Region string
	// DatabaseURL is the cell's Postgres (ASSAY_DATABASE_URL). Required.
	DatabaseURL string
	// NATSURL is the cell's NATS (ASSAY_NATS_URL). Default nats://127.0.0.1:4222.
	NATSURL string
	// ModelBaseURL is the OpenAI-compatible endpoint (ASSAY_MODEL_BASE_URL),
	// without the /v1 suffix. Required by the classifier only.
	ModelBaseURL string
	// ModelAPIKey is sent as a bearer token (ASSAY_MODEL_API_KEY). Optional.
	ModelAPIKey string
	// Model is the model name sent on every call (ASSAY_MODEL). Default assay-sim-1.
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

var settings = []setting{
	{"ASSAY_REGION", "region", "cell served by this instance (" + strings.Join(Regions, ", ") + ")", func(c *Config) *string { return &c.Region }},
	{"ASSAY_DATABASE_URL", "database-url", "the cell's Postgres URL", func(c *Config) *string { return &c.DatabaseURL }},
	{"ASSAY_NATS_URL", "nats-url", "NATS URL", func(c *Config) *string { return &c.NATSURL }},
	{"ASSAY_MODEL_BASE_URL", "model-base-url", "OpenAI-compatible endpoint, without /v1", func(c *Config) *string { return &c.ModelBaseURL }},
	{"ASSAY_MODEL_API_KEY", "model-api-key", "bearer token for the model endpoint", func(c *Config) *string { return &c.ModelAPIKey }},
	{"ASSAY_MODEL", "model", "model name", func(c *Config) *string { return &c.Model }},
	{"ASSAY_HTTP_ADDR", "http-addr", "listen address for HTTP", func(c *Config) *string { return &c.HTTPAddr }},
}

// Need says which optional settings a service requires.
type Need struct {
	Model    bool
	HTTPAddr string // default listen address
}

// Load reads the environment through getenv, then the flags in args (flags
// win), applies defaults and validates.
func Load(name string, args []string, getenv func(string) string, need Need) (Config, error) {
	var c Config
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	for _, s := range settings {
		p := s.field(&c)
		*p = getenv(s.env)
		fs.StringVar(p, s.flag, *p, s.usage+" ($"+s.env+")")
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("config: unexpected argument %q", fs.Arg(0))
	}
	if c.NATSURL == "" {
		c.NATSURL = "nats://127.0.0.1:4222"
	}
	if c.Model == "" {
		c.Model = "assay-sim-1"
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = need.HTTPAddr
	}
	return c, c.validate(need)
}

func (c Config) validate(need Need) error {
	var errs []error
	if err := ValidateRegion(c.Region); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_REGION: %w", err))
	}
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("ASSAY_DATABASE_URL: required"))
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_DATABASE_URL: cannot parse: %s", redact(err.Error(), c.DatabaseURL)))
	}
	if u, err := url.Parse(c.NATSURL); err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
		errs = append(errs, fmt.Errorf("ASSAY_NATS_URL: %q is not a nats:// or tls:// URL", c.NATSURL))
	}
	if need.Model {
		if c.ModelBaseURL == "" {
			errs = append(errs, errors.New("ASSAY_MODEL_BASE_URL: required"))
		} else if u, err := url.Parse(c.ModelBaseURL); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Errorf("ASSAY_MODEL_BASE_URL: %q is not an http(s) URL", c.ModelBaseURL))
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

// ValidateRegion accepts only the regions assay knows.
func ValidateRegion(r string) error {
	if r == "" {
		return errors.New("required")
	}
	if !slices.Contains(Regions, r) {
		return fmt.Errorf("unknown region %q (known: %s)", r, strings.Join(Regions, ", "))
	}
	return nil
}

// redact keeps a password out of an error message.
func redact(msg, rawURL string) string {
	if u, err := url.Parse(rawURL); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
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
