package natsconf

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	"assay.dev/pkg/config"
	"assay.dev/pkg/event"
)

// Credential is one service user's password in one cell.
type Credential struct {
	Names    event.Names
	Service  string
	Password string
}

// User is the credential's NATS user.
func (c Credential) User() string { return User(c.Names, c.Service) }

// NewCredentials draws a fresh password for every user of the cells (the
// services' and the operator's, then the two each cell has in its region's
// account), cells given as ParseCell reads them.
func NewCredentials(installation string, cells []string) ([]Credential, error) {
	var out []Credential
	for _, spec := range cells {
		c, err := ParseCell(spec)
		if err != nil {
			return nil, err
		}
		n := event.Names{Installation: installation, Cell: c.ID}
		for _, svc := range append(append([]string(nil), Users...), RegionUsers...) {
			pw, err := NewPassword()
			if err != nil {
				return nil, err
			}
			out = append(out, Credential{Names: n, Service: svc, Password: pw})
		}
	}
	return out, nil
}

// NewPassword is 128 random bits from crypto/rand as "p" and 32 hex digits.
// nats-server parses a variable's value from its environment as
// configuration, so the value must read back as a string: a leading letter
// keeps an all-digit draw from becoming a number, and hex has no space, #,
// : or quote to break the parse. It is also safe unquoted in a shell, an
// env file and a URL's userinfo.
func NewPassword() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("natsconf: random password: %w", err)
	}
	return "p" + hex.EncodeToString(b), nil
}

// URLVar names the line of a service's ASSAY_NATS_URL in the file
// ServiceURLs writes.
func URLVar(n event.Names, service string) string {
	return Account(n) + "_" + strings.ToUpper(service) + "_NATS_URL"
}

// ServerEnv is the server's environment file: one PasswordVar=password
// line per user, for `set -a; . FILE; set +a`, systemd's EnvironmentFile or
// docker's --env-file.
func ServerEnv(creds []Credential) string {
	var b strings.Builder
	b.WriteString("# nats-server's environment for the assay configuration, written by\n" +
		"# \"assay nats-config --passwords\". Keep it secret. Load it into the server's\n" +
		"# environment before it starts, e.g. set -a; . ./nats.env; set +a\n")
	for _, c := range creds {
		fmt.Fprintf(&b, "%s=%s\n", PasswordVar(c.Names, c.Service), c.Password)
	}
	return b.String()
}

// ServiceURLs is the services' file: per user, the ASSAY_NATS_URL its
// service connects to server with (a placement user's is the ingress's or
// the operator's ASSAY_PLACEMENT_NATS_URL, a publisher user's the
// committer's ASSAY_GITHUB_BUDGET_NATS_URL), on a line named by URLVar.
func ServiceURLs(creds []Credential, server *url.URL) string {
	var b strings.Builder
	b.WriteString("# Each service's ASSAY_NATS_URL, written by \"assay nats-config --service-urls\"\n" +
		"# with the passwords of the server's environment file. Keep it secret and give\n" +
		"# each service only its own line's value as ASSAY_NATS_URL:\n" +
		"#   ASSAY_NATS_URL=$<ACCOUNT>_<SERVICE>_NATS_URL\n" +
		"# and the ingress its cell's PLACEMENT line (the operator's tools the PLACER\n" +
		"# line) as ASSAY_PLACEMENT_NATS_URL, and the committer its cell's PUBLISHER\n" +
		"# line as ASSAY_GITHUB_BUDGET_NATS_URL.\n")
	for _, c := range creds {
		u := url.URL{Scheme: server.Scheme, User: url.UserPassword(c.User(), c.Password), Host: server.Host}
		fmt.Fprintf(&b, "%s=%s\n", URLVar(c.Names, c.Service), u.String())
	}
	return b.String()
}

// ParseServer reads the address the services reach the server at: a
// nats:// or tls:// URL with a host and nothing else.
func ParseServer(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "nats" && u.Scheme != "tls") {
		return nil, fmt.Errorf("%q is not a nats:// or tls:// URL", config.Redacted(raw))
	}
	if u.User != nil || strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("%q: give only scheme, host and port; the user and password are written per service", config.Redacted(raw))
	}
	return u, nil
}

// SecretFile is a file WriteSecrets creates.
type SecretFile struct{ Path, Content string }

// WriteSecrets creates each file, readable and writable by its owner only.
// It never overwrites: a path that exists fails the whole call, and on any
// failure none of the files it created is left behind.
func WriteSecrets(files ...SecretFile) (err error) {
	var created []*os.File
	defer func() {
		for _, f := range created {
			if cerr := f.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}
		if err != nil {
			for _, f := range created {
				_ = os.Remove(f.Name())
			}
		}
	}()
	// Create every file before writing any, so one that exists stops the
	// call before a secret is written.
	for _, sf := range files {
		f, err := os.OpenFile(sf.Path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists; not overwritten (remove it to draw new passwords)", sf.Path)
		}
		if err != nil {
			return err
		}
		created = append(created, f)
	}
	for i, sf := range files {
		f := created[i]
		// The mode passed to OpenFile is only narrowed by the umask; set it
		// exactly.
		if err := f.Chmod(0o600); err != nil {
			return err
		}
		if _, err := f.WriteString(sf.Content); err != nil {
			return err
		}
	}
	return nil
}
