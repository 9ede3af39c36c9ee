package config

import (
	"errors"
	"net/url"
	"slices"
	"strings"
	"time"
)

// A setting's value is redacted by what it is, not by the setting's name:
// any value that is a URL, a comma-separated list of URLs or a Postgres
// key=value string has its credentials replaced wherever it is shown (the
// start-up log line, errors, what /readyz logs). A setting whose name says
// it holds an opaque secret (a webhook secret, a token, an API key) is
// shown only as set, since nothing in its value says what it is.

// mask replaces a credential wherever one is shown.
const mask = "xxxxx"

// unparsed stands for a part of a value that looks like a URL and does not
// parse: what in it is a credential cannot be told, so none of it is shown.
const unparsed = "(a value that does not parse as a URL)"

// Redacted is a setting's value fit for a log line or a message, whatever
// the setting. In a URL, and in each URL of a comma-separated list (a NATS
// cluster's nodes, the later hosts of a Postgres multi-host URL), the
// password is replaced by xxxxx, and so is a user that stands alone, which
// is a token (https://TOKEN@host), except in a Postgres URL, where it is
// the role; so is every query parameter named for a credential (password,
// sslpassword, token, access_token, key, secret and the like). In a
// Postgres key=value string (host=… password=…) the same parameters are
// replaced. A part that looks like a URL and does not parse is withheld;
// any other value is given as it is.
func Redacted(raw string) string {
	return redacted(raw, func(string) {})
}

// RedactedSetting is the value of the setting name as a start-up log line
// shows it: a secret (see Secret) only as "(set)", any other value as
// Redacted shows it.
func RedactedSetting(name, value string) string {
	if Secret(name, value) {
		return "(set)"
	}
	return Redacted(value)
}

// Secret says whether value, set for the setting name, is an opaque
// secret, which nothing in it tells: the setting's name holds SECRET,
// TOKEN, KEY, PASSWORD or CREDENTIAL. A file's path (a name ending in
// _FILE) is not the secret it holds, and a duration (ASSAY_TOKEN_CACHE's)
// is none.
func Secret(name, value string) bool {
	if value == "" || strings.HasSuffix(name, "_FILE") {
		return false
	}
	if _, err := time.ParseDuration(value); err == nil {
		return false
	}
	for _, w := range []string{"SECRET", "TOKEN", "KEY", "PASSWORD", "CREDENTIAL"} {
		if strings.Contains(strings.ToUpper(name), w) {
			return true
		}
	}
	return false
}

// Scrub is msg with every credential that any of values carries (as
// Redacted finds them: passwords, tokens, credential parameters, in their
// plain and their escaped forms) replaced by xxxxx: for a message made by
// a library that may quote a setting's value.
func Scrub(msg string, values ...string) string {
	var found []string
	add := func(s string) {
		if s != "" && s != mask {
			found = append(found, s)
		}
	}
	for _, v := range values {
		redacted(v, add)
		// Read whole as well, for a password that holds a comma.
		redactedPart(v, add)
	}
	// The longest first, so that a credential holding another is
	// replaced whole.
	slices.SortFunc(found, func(a, b string) int { return len(b) - len(a) })
	for _, s := range found {
		msg = strings.ReplaceAll(msg, s, mask)
	}
	return msg
}

// RedactError is err with the credentials of values kept out of its text,
// and the URL of a *url.Error it wraps (net/http's, which keeps a lone
// user and the query) redacted. errors.Is and errors.As still see what err
// wraps.
func RedactError(err error, values ...string) error {
	if err == nil {
		return nil
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		values = append(values, ue.URL)
		ue.URL = Redacted(ue.URL)
	}
	msg := err.Error()
	if s := Scrub(msg, values...); s != msg {
		return redactedError{msg: s, err: err}
	}
	return err
}

type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }

// redacted is Redacted, telling found of every credential it replaces.
func redacted(raw string, found func(string)) string {
	if isKeyValue(raw) {
		return redactKeyValue(raw, found)
	}
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		parts[i] = redactedPart(p, found)
	}
	return strings.Join(parts, ",")
}

// redactedPart is one part of a comma-separated value. A part that is no
// URL (a duration, a path, a host and port) is given as it is; one that
// has no scheme but a user or a query (a later host of a Postgres
// multi-host URL, user:password@host) is read as the host part of a URL.
func redactedPart(p string, found func(string)) string {
	t := strings.TrimSpace(p)
	if !strings.Contains(t, "://") && !strings.ContainsAny(t, "@?") {
		return p
	}
	prefix := ""
	if !strings.Contains(t, "://") {
		prefix = "//"
	}
	u, err := url.Parse(prefix + t)
	if err != nil || u.Opaque != "" {
		unparsedCredentials(t, found)
		return unparsed
	}
	redactURL(u, found)
	return strings.TrimPrefix(u.String(), prefix)
}

// redactURL replaces u's password, or its lone user outside Postgres, and
// its credential parameters.
func redactURL(u *url.URL, found func(string)) {
	if u.User != nil {
		name := u.User.Username()
		escaped := u.User.String()
		if pw, ok := u.User.Password(); ok {
			found(pw)
			if _, e, ok := strings.Cut(escaped, ":"); ok {
				found(e)
			}
			u.User = url.UserPassword(name, mask)
		} else if name != "" && u.Scheme != "postgres" && u.Scheme != "postgresql" {
			found(name)
			found(escaped)
			u.User = url.User(mask)
		}
	}
	u.RawQuery = redactQuery(u.RawQuery, found)
}

// redactQuery replaces the value of each parameter of a raw query that is
// named for a credential. Semicolons are taken as separators too, as some
// readers take them.
func redactQuery(raw string, found func(string)) string {
	if raw == "" {
		return raw
	}
	var b strings.Builder
	for raw != "" {
		pair, sep := raw, ""
		if i := strings.IndexAny(raw, "&;"); i >= 0 {
			pair, sep, raw = raw[:i], raw[i:i+1], raw[i+1:]
		} else {
			raw = ""
		}
		k, v, ok := strings.Cut(pair, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if ok && credentialName(name) {
			found(v)
			if plain, err := url.QueryUnescape(v); err == nil {
				found(plain)
			}
			pair = k + "=" + mask
		}
		b.WriteString(pair)
		b.WriteString(sep)
	}
	return b.String()
}

// unparsedCredentials tells found of what in a part that does not parse as
// a URL may be a credential: its user information and its query's
// credential parameters.
func unparsedCredentials(p string, found func(string)) {
	rest := p
	if _, after, ok := strings.Cut(rest, "://"); ok {
		rest = after
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		info := rest[:i]
		found(info)
		if _, pw, ok := strings.Cut(info, ":"); ok {
			found(pw)
		}
	}
	if _, q, ok := strings.Cut(p, "?"); ok {
		redactQuery(q, found)
	}
}

// credentialName says whether a parameter is named for a credential:
// password, sslpassword, passwd, pwd, token, access_token, key, api_key,
// secret, client_secret, sig, credential, auth and the like.
func credentialName(name string) bool {
	n := strings.ToLower(name)
	for _, w := range []string{"pass", "pwd", "secret", "token", "key", "sig", "credential", "auth"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// isKeyValue says whether raw is a Postgres key=value string: it begins
// with a keyword and an equals sign (host=… or host = …), which no URL does.
func isKeyValue(raw string) bool {
	s := strings.TrimLeft(raw, " \t\n\r")
	i := 0
	for i < len(s) && (s[i] == '_' || s[i] == '-' || s[i] == '.' || 'a' <= s[i] && s[i] <= 'z' || 'A' <= s[i] && s[i] <= 'Z' || i > 0 && '0' <= s[i] && s[i] <= '9') {
		i++
	}
	if i == 0 {
		return false
	}
	s = strings.TrimLeft(s[i:], " \t\n\r")
	return strings.HasPrefix(s, "=")
}

// redactKeyValue replaces the value of each credential parameter of a
// Postgres key=value string, quoted ('…', with backslash escapes) or not.
func redactKeyValue(s string, found func(string)) string {
	space := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	var b strings.Builder
	i := 0
	for i < len(s) {
		j := i
		for j < len(s) && space(s[j]) {
			j++
		}
		for j < len(s) && s[j] != '=' && !space(s[j]) {
			j++
		}
		key := strings.TrimLeft(s[i:j], " \t\n\r")
		k := j
		for k < len(s) && space(s[k]) {
			k++
		}
		if k >= len(s) || s[k] != '=' {
			// A word that is not a parameter: given as it is.
			b.WriteString(s[i:k])
			i = k
			continue
		}
		k++
		for k < len(s) && space(s[k]) {
			k++
		}
		b.WriteString(s[i:k])
		v := k
		if v < len(s) && s[v] == '\'' {
			v++
			for v < len(s) && s[v] != '\'' {
				if s[v] == '\\' {
					v++
				}
				v++
			}
			v = min(v+1, len(s))
		} else {
			for v < len(s) && !space(s[v]) {
				if s[v] == '\\' {
					v++
				}
				v++
			}
			v = min(v, len(s))
		}
		value := s[k:v]
		if credentialName(key) {
			found(value)
			found(strings.Trim(value, "'"))
			value = mask
		}
		b.WriteString(value)
		i = v
	}
	return b.String()
}
