// Package config reads the settings every assay service shares from the
// environment, with flags mirroring it, and refuses bad values at start-up
// with an error that names the setting.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"assay.dev/pkg/dbpool"
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
	// NATSURL is the cell's NATS (ASSAY_NATS_URL): a URL, or the URLs of a
	// cluster's nodes separated by commas. Default nats://127.0.0.1:4222.
	NATSURL string
	// ModelBaseURL is the OpenAI-compatible API's base URL
	// (ASSAY_MODEL_BASE_URL), taken as OpenAI's SDKs take base_url: as
	// given, with /chat/completions appended (https://api.openai.com/v1).
	// The classifier needs it or ModelEndpoint.
	ModelBaseURL string
	// ModelEndpoint is the chat-completions URL itself, asked as given
	// (ASSAY_MODEL_ENDPOINT), for a server whose route does not end in
	// /chat/completions under a base. Optional; it wins over ModelBaseURL
	// for chat completions.
	ModelEndpoint string
	// ModelAPIKey is sent as a bearer token (ASSAY_MODEL_API_KEY). Optional.
	ModelAPIKey string
	// Model is the model name sent on every call (ASSAY_MODEL). Required by
	// the classifier: there is no default model of a real endpoint.
	Model string
	// HTTPAddr is where the service serves its API, /healthz and /readyz
	// (ASSAY_HTTP_ADDR). Default given by the service.
	HTTPAddr string
	// MetricsAddr is where /metrics is served, on a listener of its own and
	// never on HTTPAddr (ASSAY_METRICS_ADDR), so a scraper can be let in
	// there and nowhere else and the API's port never shows tenant ids or
	// their outcomes. Default given by the service (127.0.0.1:9090–9093);
	// "" serves no metrics at all.
	MetricsAddr string
	// StartupWait is how long start-up waits for Postgres and NATS to
	// answer, trying again with capped backoff (ASSAY_STARTUP_WAIT, a Go
	// duration). Default 60s; 0 tries once. Creating a stream or bucket
	// waits out a JetStream cluster that is not ready as long
	// (Streams.Wait).
	StartupWait time.Duration
	// DatabasePool is how many connections this service's Postgres pool
	// holds (ASSAY_DATABASE_POOL, 1 to 1000). 0, the default, takes the
	// URL's pool_max_conns, else dbpool.DefaultMaxConns (10).
	DatabasePool int
	// MetricsTenants is how many tenants get a metric label of their own;
	// the rest are "other" (ASSAY_METRICS_TENANTS, 1 to 1000). Default 20.
	MetricsTenants int
}

// Setting describes one setting: its variable, its flag, its default and
// its field.
type setting struct {
	env, flag, def, usage string
	field                 func(*Config) *string
	model                 bool // read only by a service that calls the model
}

// raw holds the settings that are parsed after they are read.
type raw struct {
	regions, replicas, maxAge, placement, startupWait, metricsTenants, databasePool string
}

var settings = []setting{
	{"ASSAY_REGION", "region", "", "the region served by this instance, one of ASSAY_REGIONS; required", func(c *Config) *string { return &c.Region }, false},
	{"ASSAY_CELL", "cell", "the region", "cell served by this instance", func(c *Config) *string { return &c.Cell }, false},
	{"ASSAY_INSTALLATION", "installation", event.DefaultInstallation, "prefix of every stream, subject and durable", func(c *Config) *string { return &c.Installation }, false},
	{"ASSAY_DATABASE_URL", "database-url", "", "the cell's Postgres URL; required", func(c *Config) *string { return &c.DatabaseURL }, false},
	{"ASSAY_NATS_URL", "nats-url", defaultNATSURL, "NATS URL, or a cluster's node URLs comma separated, with this service's user and password", func(c *Config) *string { return &c.NATSURL }, false},
	{"ASSAY_MODEL_BASE_URL", "model-base-url", "", "OpenAI-compatible API's base URL as the SDKs take it (…/v1); /chat/completions is appended; required unless ASSAY_MODEL_ENDPOINT is set", func(c *Config) *string { return &c.ModelBaseURL }, true},
	{"ASSAY_MODEL_ENDPOINT", "model-endpoint", "", "the chat-completions URL itself, asked as given (instead of ASSAY_MODEL_BASE_URL)", func(c *Config) *string { return &c.ModelEndpoint }, true},
	{"ASSAY_MODEL_API_KEY", "model-api-key", "", "bearer token for the model endpoint", func(c *Config) *string { return &c.ModelAPIKey }, true},
	{"ASSAY_MODEL", "model", "", "model name the endpoint serves (e.g. gpt-4o-mini); required", func(c *Config) *string { return &c.Model }, true},
	{"ASSAY_HTTP_ADDR", "http-addr", "", "listen address for the API, /healthz and /readyz", func(c *Config) *string { return &c.HTTPAddr }, false},
	{"ASSAY_METRICS_ADDR", "metrics-addr", "", "listen address for /metrics, a listener of its own: ASSAY_HTTP_ADDR never serves it", func(c *Config) *string { return &c.MetricsAddr }, false},
}

const defaultNATSURL = "nats://127.0.0.1:4222"

// Need says which optional settings a service requires.
type Need struct {
	Model       bool
	HTTPAddr    string // default listen address
	MetricsAddr string // default listen address of /metrics
}

// defaultAddr is the default of an address setting for a service with
// need; false for any other setting.
func (need Need) defaultAddr(env string) (string, bool) {
	switch env {
	case "ASSAY_HTTP_ADDR":
		return need.HTTPAddr, true
	case "ASSAY_METRICS_ADDR":
		return need.MetricsAddr, true
	}
	return "", false
}

var rawSettings = []struct {
	env, flag, def, usage string
	field                 func(*raw) *string
}{
	{"ASSAY_REGIONS", "regions", "us,eu", "regions of the installation, comma separated", func(r *raw) *string { return &r.regions }},
	{"ASSAY_STREAM_REPLICAS", "stream-replicas", "1", "replicas of the streams this instance creates: 1 to 5", func(r *raw) *string { return &r.replicas }},
	{"ASSAY_STREAM_MAX_AGE", "stream-max-age", "168h", "history the streams keep for replay, a Go duration", func(r *raw) *string { return &r.maxAge }},
	{"ASSAY_STREAM_PLACEMENT", "stream-placement", "none", "server tags the streams are placed by, comma separated", func(r *raw) *string { return &r.placement }},
	{"ASSAY_STARTUP_WAIT", "startup-wait", "60s", "how long start-up waits for Postgres and NATS, a Go duration (0: try once)", func(r *raw) *string { return &r.startupWait }},
	{"ASSAY_DATABASE_POOL", "database-pool", "", "connections in this service's Postgres pool, 1 to 1000 (unset: the URL's pool_max_conns, else 10)", func(r *raw) *string { return &r.databasePool }},
	{"ASSAY_METRICS_TENANTS", "metrics-tenants", "20", "tenants with a metric label of their own; the rest are \"other\"", func(r *raw) *string { return &r.metricsTenants }},
}

// Var is one setting a service reads from the environment alone, for its
// help: its variable, its default as text, and what it sets.
type Var struct {
	Name, Default, Usage string
}

// ErrHelp is Load's answer to -h or --help: print Usage and exit 0.
var ErrHelp = flag.ErrHelp

// ErrVersion is Load's answer to --version: print the version and exit 0.
var ErrVersion = errors.New("config: version asked for")

// Shared are the variables Load reads for a service with need: the shared
// settings (the model's only when it calls one), each with its default.
// With a service's own Vars they are every variable it reads.
func Shared(need Need) []Var {
	var out []Var
	for _, s := range settings {
		if s.model && !need.Model {
			continue
		}
		def := s.def
		if addr, ok := need.defaultAddr(s.env); ok {
			def = addr
		}
		out = append(out, Var{Name: s.env, Default: def, Usage: s.usage})
	}
	for _, s := range rawSettings {
		out = append(out, Var{Name: s.env, Default: s.def, Usage: s.usage})
	}
	return out
}

// Usage is the help of a service: its flags (each mirrors a variable; the
// model's only for a service that calls it) and then every variable of its
// own, each with its default.
func Usage(name, doc string, need Need, own []Var) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s [flags]\n\n%s\n\nFlags (each also read from its variable; a flag wins):\n", name, doc)
	row := func(flag, env, def, usage string) {
		if def != "" {
			usage += " (default " + def + ")"
		}
		fmt.Fprintf(&b, "  --%-18s %-28s %s\n", flag, env, usage)
	}
	for _, s := range settings {
		if s.model && !need.Model {
			continue
		}
		def := s.def
		if addr, ok := need.defaultAddr(s.env); ok {
			def = addr
		}
		row(s.flag, s.env, def, s.usage)
	}
	for _, s := range rawSettings {
		row(s.flag, s.env, s.def, s.usage)
	}
	row("version", "", "", "print the version and exit")
	if len(own) > 0 {
		fmt.Fprintf(&b, "\nEnvironment (%s's own):\n", name)
		for _, v := range own {
			usage := v.Usage
			if v.Default != "" {
				usage += " (default " + v.Default + ")"
			}
			fmt.Fprintf(&b, "  %-30s %s\n", v.Name, usage)
		}
	}
	b.WriteString("\nA bad setting stops start-up with exit code 2 and names the setting.\n")
	return b.String()
}

// Load reads the environment through getenv, then the flags in args (flags
// win), applies defaults and validates.
func Load(name string, args []string, getenv func(string) string, need Need) (Config, error) {
	var c Config
	var r raw
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	for _, s := range settings {
		p := s.field(&c)
		*p = getenv(s.env)
		if s.model && !need.Model {
			continue
		}
		fs.StringVar(p, s.flag, *p, s.usage+" ($"+s.env+")")
	}
	for _, s := range rawSettings {
		p := s.field(&r)
		*p = getenv(s.env)
		fs.StringVar(p, s.flag, *p, s.usage+" ($"+s.env+")")
	}
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return Config{}, ErrHelp
		}
		return Config{}, Invalid(err)
	}
	if *version {
		return Config{}, ErrVersion
	}
	if fs.NArg() > 0 {
		return Config{}, Invalid(fmt.Errorf("config: unexpected argument %q", Redacted(fs.Arg(0))))
	}
	var errs []error
	c.Regions, c.Streams, errs = r.parse()
	errs = append(errs, r.numbers(&c)...)
	c.defaults(need)
	if err := c.validate(need, errs); err != nil {
		return c, err
	}
	c.DatabasePool = dbpool.Size(c.DatabaseURL, c.DatabasePool)
	return c, nil
}

// numbers reads the settings that are a duration or a count into c, or
// their defaults; each error names its variable.
func (r raw) numbers(c *Config) []error {
	var errs []error
	c.StartupWait = 60 * time.Second
	if r.startupWait != "" {
		d, err := time.ParseDuration(r.startupWait)
		if err != nil || d < 0 || d > time.Hour {
			errs = append(errs, fmt.Errorf("ASSAY_STARTUP_WAIT: %q is not a duration from 0s to 1h", Redacted(r.startupWait)))
		}
		c.StartupWait = d
	}
	c.MetricsTenants = 20
	if r.metricsTenants != "" {
		n, err := strconv.Atoi(r.metricsTenants)
		if err != nil || n < 1 || n > 1000 {
			errs = append(errs, fmt.Errorf("ASSAY_METRICS_TENANTS: %q is not a whole number from 1 to 1000", Redacted(r.metricsTenants)))
		}
		c.MetricsTenants = n
	}
	if r.databasePool != "" {
		n, err := strconv.Atoi(r.databasePool)
		if err != nil || n < 1 || n > 1000 {
			errs = append(errs, fmt.Errorf("ASSAY_DATABASE_POOL: %q is not a whole number from 1 to 1000", Redacted(r.databasePool)))
		}
		c.DatabasePool = n
	}
	return errs
}

// defaults fills in what the settings leave unset, and the streams'
// settings the services will run with, so the start-up log shows them.
func (c *Config) defaults(need Need) {
	if c.Cell == "" {
		c.Cell = c.Region
	}
	if c.NATSURL == "" {
		c.NATSURL = defaultNATSURL
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = need.HTTPAddr
	}
	if c.MetricsAddr == "" {
		c.MetricsAddr = need.MetricsAddr
	}
	if c.Installation == "" {
		c.Installation = event.DefaultInstallation
	}
	// Creating a stream or bucket waits out a cluster that is not ready
	// as long as start-up waits for NATS; 0 tries once.
	c.Streams.Wait = c.StartupWait
	if c.StartupWait == 0 {
		c.Streams.Wait = -1
	}
	c.Streams = c.Streams.WithDefaults()
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
			errs = append(errs, fmt.Errorf("ASSAY_STREAM_REPLICAS: %q is not a whole number from 1 to 5", Redacted(r.replicas)))
		}
		st.Replicas = n
	}
	if r.maxAge != "" {
		d, err := time.ParseDuration(r.maxAge)
		if err != nil || d < time.Hour || d > 366*24*time.Hour {
			errs = append(errs, fmt.Errorf("ASSAY_STREAM_MAX_AGE: %q is not a duration from 1h to 8784h", Redacted(r.maxAge)))
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
			return nil, fmt.Errorf("%q is not a region name (lower-case letters, digits, hyphens)", Redacted(r))
		}
		if slices.Contains(out, r) {
			return nil, fmt.Errorf("region %q is listed twice", Redacted(r))
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
	if c.Region == "" {
		errs = append(errs, fmt.Errorf("%w (known: %s)", Missing("ASSAY_REGION"), strings.Join(c.Regions, ", ")))
	} else if err := ValidateRegion(c.Regions, c.Region); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_REGION: %w", err))
	}
	if !event.ValidToken(c.Cell) && c.Region != "" {
		errs = append(errs, fmt.Errorf("ASSAY_CELL: %q is not a cell id (lower-case letters, digits, hyphens)", Redacted(c.Cell)))
	}
	if !event.ValidToken(c.Installation) {
		errs = append(errs, fmt.Errorf("ASSAY_INSTALLATION: %q is not an installation name (lower-case letters, digits, hyphens)", Redacted(c.Installation)))
	}
	if c.DatabaseURL == "" {
		errs = append(errs, Missing("ASSAY_DATABASE_URL"))
	} else if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_DATABASE_URL: cannot parse: %s", Scrub(err.Error(), c.DatabaseURL)))
	}
	if err := CheckNATSURL(c.NATSURL); err != nil {
		errs = append(errs, fmt.Errorf("ASSAY_NATS_URL: %w", err))
	}
	if need.Model {
		errs = append(errs, CheckModel(c.ModelBaseURL, c.ModelEndpoint, c.Model)...)
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			errs = append(errs, fmt.Errorf("ASSAY_HTTP_ADDR: %q: %s", Redacted(c.HTTPAddr), Scrub(err.Error(), c.HTTPAddr)))
		}
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("ASSAY_METRICS_ADDR: %q: %s", Redacted(c.MetricsAddr), Scrub(err.Error(), c.MetricsAddr)))
		} else if _, port, _ := net.SplitHostPort(c.MetricsAddr); c.MetricsAddr == c.HTTPAddr && port != "0" {
			errs = append(errs, fmt.Errorf("ASSAY_METRICS_ADDR: %q is ASSAY_HTTP_ADDR; /metrics is served on a port of its own", Redacted(c.MetricsAddr)))
		}
	}
	if len(errs) > 0 {
		return Invalid(fmt.Errorf("config: %w", errors.Join(errs...)))
	}
	return nil
}

// CheckModel checks where the model is asked and its name: a base URL
// (ASSAY_MODEL_BASE_URL, /chat/completions appended) or an endpoint
// (ASSAY_MODEL_ENDPOINT, as given), each an http(s) URL, and a model name.
// A base URL that already ends in /chat/completions is refused: the SDKs'
// rule would ask …/chat/completions/chat/completions.
func CheckModel(base, endpoint, model string) []error {
	var errs []error
	if base == "" && endpoint == "" {
		errs = append(errs, fmt.Errorf("%w (or ASSAY_MODEL_ENDPOINT, the chat-completions URL asked as given)", Missing("ASSAY_MODEL_BASE_URL")))
	}
	for _, v := range []struct{ name, raw string }{{"ASSAY_MODEL_BASE_URL", base}, {"ASSAY_MODEL_ENDPOINT", endpoint}} {
		if v.raw == "" {
			continue
		}
		if u, err := url.Parse(v.raw); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Errorf("%s: %q is not an http(s) URL", v.name, Redacted(v.raw)))
		}
	}
	if u, err := url.Parse(base); err == nil && strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/chat/completions") {
		errs = append(errs, fmt.Errorf("ASSAY_MODEL_BASE_URL: %q is a chat-completions endpoint, and a base URL gets /chat/completions appended "+
			"(as OpenAI's SDKs take base_url); give the base (…/v1), or set ASSAY_MODEL_ENDPOINT to ask this URL as given", Redacted(base)))
	}
	if model == "" {
		errs = append(errs, fmt.Errorf("%w: there is no default model of a real endpoint", Missing("ASSAY_MODEL")))
	}
	return errs
}

// Missing is the error of a required setting left unset, the same for
// every command and service: its variable, the flag that mirrors it, and
// what it is.
func Missing(env string) error {
	for _, s := range settings {
		if s.env == env {
			what, _, _ := strings.Cut(s.usage, ";")
			return fmt.Errorf("%s (--%s): required: %s", env, s.flag, what)
		}
	}
	return fmt.Errorf("%s: required", env)
}

// ValidateRegion accepts only a region of the installation's.
func ValidateRegion(regions []string, r string) error {
	if r == "" {
		return errors.New("required: the region served (one of " + strings.Join(regions, ", ") + ")")
	}
	if !slices.Contains(regions, r) {
		return fmt.Errorf("unknown region %q (known: %s; ASSAY_REGIONS sets them)", Redacted(r), strings.Join(regions, ", "))
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

// Redacted is the configuration as a start-up log line shows it: every
// value as Redacted shows it, whatever its setting (a URL's password,
// token and credential parameters replaced), and the API key only as set
// or not.
func (c Config) Redacted() map[string]any {
	return map[string]any{
		"region": Redacted(c.Region), "cell": Redacted(c.Cell), "installation": Redacted(c.Installation), "regions": strings.Join(c.Regions, ","),
		"database_url": Redacted(c.DatabaseURL), "nats_url": Redacted(c.NATSURL),
		"model_base_url": Redacted(c.ModelBaseURL), "model_endpoint": Redacted(c.ModelEndpoint), "model": Redacted(c.Model),
		"model_api_key": RedactedSetting("ASSAY_MODEL_API_KEY", c.ModelAPIKey), "http_addr": Redacted(c.HTTPAddr), "metrics_addr": Redacted(c.MetricsAddr),
		"startup_wait": c.StartupWait.String(), "database_pool": c.DatabasePool, "stream_replicas": c.Streams.Replicas, "stream_max_age": c.Streams.MaxAge.String(),
	}
}

// CheckNATSURL says whether raw is what nats.Connect takes: a nats:// or
// tls:// URL, or a cluster's nodes as a comma-separated list of them.
func CheckNATSURL(raw string) error {
	for _, p := range strings.Split(raw, ",") {
		if u, err := url.Parse(strings.TrimSpace(p)); err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
			return fmt.Errorf("%q is not a nats:// or tls:// URL, or a comma-separated list of them", Redacted(raw))
		}
	}
	return nil
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
		return Invalid(fmt.Errorf("%s: %q is not a whole number from %d to %d", name, Redacted(v), min, max))
	}
	*to = n
	return nil
}

// Asked lists, in first-asked order, the variables fromEnv reads when none
// is set: what a service's Vars must list.
func Asked(fromEnv func(getenv func(string) string) error) []string {
	var names []string
	seen := map[string]bool{}
	_ = fromEnv(func(k string) string {
		if !seen[k] {
			seen[k] = true
			names = append(names, k)
		}
		return ""
	})
	return names
}

// CheckVars says where a service's Vars, which --help prints, differ from
// what its fromEnv reads: a variable read and not listed, one listed and
// not read, or one listed without a default or a usage. Empty when they
// agree.
func CheckVars(vars []Var, fromEnv func(getenv func(string) string) error) []string {
	var problems []string
	listed := map[string]bool{}
	for _, v := range vars {
		listed[v.Name] = true
		if v.Default == "" || v.Usage == "" {
			problems = append(problems, v.Name+" has no default or no usage")
		}
	}
	asked := map[string]bool{}
	for _, name := range Asked(fromEnv) {
		asked[name] = true
		if !listed[name] {
			problems = append(problems, name+" is read but not listed")
		}
	}
	for _, v := range vars {
		if !asked[v.Name] {
			problems = append(problems, v.Name+" is listed but not read")
		}
	}
	return problems
}

// Choice is a setting of two words: Default (or unset) leaves To false,
// Other sets it.
type Choice struct {
	Name           string // the variable, e.g. ASSAY_SHED
	Default, Other string // the two words it takes
	To             *bool  // set true by Other
}

// Choices reads each variable as one of its two words. The error names the
// variable and both words.
func Choices(getenv func(string) string, cs ...Choice) error {
	for _, c := range cs {
		switch v := getenv(c.Name); v {
		case "", c.Default:
		case c.Other:
			*c.To = true
		default:
			return Invalid(fmt.Errorf("%s: %q is not %s or %s", c.Name, Redacted(v), c.Default, c.Other))
		}
	}
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
			return Invalid(fmt.Errorf("%s: %q is not a duration from %s to %s", d.Name, Redacted(v), d.Min, d.Max))
		}
		*d.To = dur
	}
	return nil
}
