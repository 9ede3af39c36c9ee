package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"
)

// WorkID is deterministic from the ingress key, so a duplicate names the
// same work everywhere, even before it reaches the database.
func WorkID(tenant, contractName, sourceID, revision string) string {
	h := sha256.New()
	for _, p := range []string{tenant, contractName, sourceID, revision} {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "w_" + hex.EncodeToString(h.Sum(nil))[:24]
}

// ValidWorkID reports whether id has the form WorkID gives: w_ and 24
// lower-case hex digits.
func ValidWorkID(id string) bool {
	if len(id) != 26 || id[:2] != "w_" {
		return false
	}
	for _, c := range id[2:] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Digest is the content digest of a work's input.
func Digest(input []byte) string {
	h := sha256.Sum256(input)
	return "sha256:" + hex.EncodeToString(h[:])
}

// Sign returns the X-Hub-Signature-256 value for body, as GitHub computes it.
func Sign(secret string, body []byte) string {
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// VerifySignature checks GitHub's X-Hub-Signature-256 header: "sha256="
// and the hex HMAC-SHA256 of the raw body keyed with the webhook secret.
// The comparison takes the same time wherever the first difference is.
func VerifySignature(secret string, body []byte, header string) bool {
	hexSig, ok := strings.CutPrefix(header, "sha256=")
	if !ok || secret == "" {
		return false
	}
	got, err := hex.DecodeString(hexSig)
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}

// fullNameRE is a repository's owner/name: GitHub owner logins are
// letters, digits and hyphens (at most 39); repository names letters,
// digits and ._- (at most 100).
var fullNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$`)

// FullNameOK reports whether s is the form of a repository's full name,
// owner/repo. It admits the names . and ..; RepositoryPatternOK does not.
func FullNameOK(s string) bool { return fullNameRE.MatchString(s) }

// RepositoryPatternOK reports whether p is a pattern an installation link
// can cover: "owner/*" or "owner/repo".
func RepositoryPatternOK(p string) bool {
	if owner, ok := strings.CutSuffix(p, "/*"); ok {
		return fullNameRE.MatchString(owner + "/x")
	}
	_, r, _ := strings.Cut(p, "/")
	return fullNameRE.MatchString(p) && r != "." && r != ".."
}
