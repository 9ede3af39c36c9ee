// Package fakegithub is a GitHub REST API in memory, serving the shapes
// assay uses: installation tokens, check runs, pull request review comments
// and conversation comments (the publisher), and pull request diffs
// (ingress), each readable only with a token that may read its repository.
// It counts what was made, and can answer with a fault (a 5xx, a secondary
// rate limit), be down until told otherwise, or stop answering after it has
// made something, as a dying publisher would see it.
package fakegithub

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CheckRun is a check run as stored.
type CheckRun struct {
	ID         int64  `json:"id"`
	Name       string `json:"name"`
	HeadSHA    string `json:"head_sha"`
	ExternalID string `json:"external_id"`
	Status     string `json:"status"`
	Conclusion string `json:"conclusion"`
	Output     struct {
		Title   string `json:"title"`
		Summary string `json:"summary"`
	} `json:"output"`
	Repo  string `json:"-"`
	Edits int    `json:"-"`
}

// Comment is a review comment (Path set) or a conversation comment.
type Comment struct {
	ID       int64  `json:"id"`
	Body     string `json:"body"`
	Path     string `json:"path,omitempty"`
	Line     int    `json:"line,omitempty"`
	CommitID string `json:"commit_id,omitempty"`
	Side     string `json:"side,omitempty"`
	Repo     string `json:"-"`
	Number   int64  `json:"-"`
	Review   bool   `json:"-"`
	Edits    int    `json:"-"`
}

// Fault is an answer given instead of the real one.
type Fault struct {
	Status     int
	RetryAfter string // the Retry-After header, "" for none
	Body       string
}

// Request is one request the server got.
type Request struct {
	Method, Path string
	At           time.Time
	Status       int
}

// Server is the fake API.
type Server struct {
	*httptest.Server

	mu       sync.Mutex
	nextID   int64
	runs     []*CheckRun
	comments []*Comment
	faults   []Fault
	down     *Fault // answers every request but token ones while set
	hangs    int    // after making this many more things, hang instead of answering (0: never)
	hung     chan struct{}
	log      []Request

	appID    int64
	appKey   *rsa.PublicKey
	installs map[int64][]string // installation -> repository patterns
	static   string             // a token that reads every repository
	pulls    map[string]pull    // "owner/repo#n" -> the pull request
}

// pull is a pull request whose diff is served.
type pull struct {
	base, head, diff string
}

// New starts a fake API; Close stops it.
func New() *Server {
	s := &Server{nextID: 1000}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /app/installations/{id}/access_tokens", s.token)
	mux.HandleFunc("GET /repos/{owner}/{repo}/commits/{sha}/check-runs", s.listRuns)
	mux.HandleFunc("POST /repos/{owner}/{repo}/check-runs", s.createRun)
	mux.HandleFunc("PATCH /repos/{owner}/{repo}/check-runs/{id}", s.editRun)
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{n}/comments", s.listComments(true))
	mux.HandleFunc("POST /repos/{owner}/{repo}/pulls/{n}/comments", s.createComment(true))
	mux.HandleFunc("PATCH /repos/{owner}/{repo}/pulls/comments/{id}", s.editComment(true))
	mux.HandleFunc("GET /repos/{owner}/{repo}/issues/{n}/comments", s.listComments(false))
	mux.HandleFunc("POST /repos/{owner}/{repo}/issues/{n}/comments", s.createComment(false))
	mux.HandleFunc("PATCH /repos/{owner}/{repo}/issues/comments/{id}", s.editComment(false))
	mux.HandleFunc("GET /repos/{owner}/{repo}/compare/{basehead}", s.diff)
	mux.HandleFunc("GET /repos/{owner}/{repo}/pulls/{n}", s.diff)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		s.mu.Lock()
		var f *Fault
		if !strings.HasPrefix(r.URL.Path, "/app/") {
			if s.down != nil {
				f = s.down
			} else if len(s.faults) > 0 {
				f = &s.faults[0]
				s.faults = s.faults[1:]
			}
		}
		s.mu.Unlock()
		if f != nil {
			if f.RetryAfter != "" {
				w.Header().Set("Retry-After", f.RetryAfter)
			}
			rec.WriteHeader(f.Status)
			fmt.Fprint(rec, f.Body)
		} else if tokenOf(r) == "" && !strings.HasPrefix(r.URL.Path, "/app/") {
			rec.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(rec, `{"message":"Bad credentials"}`)
		} else {
			mux.ServeHTTP(rec, r)
		}
		s.mu.Lock()
		s.log = append(s.log, Request{Method: r.Method, Path: r.URL.Path, At: time.Now(), Status: rec.status})
		s.mu.Unlock()
	}))
	return s
}

type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) { r.status = code; r.ResponseWriter.WriteHeader(code) }

// FailNext answers the next requests (other than token requests) with the
// faults, in order.
func (s *Server) FailNext(f ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, f...)
}

// Down answers every request other than token requests with f until
// Down(nil): GitHub in an incident.
func (s *Server) Down(f *Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down = f
}

// App makes token requests prove they come from app id: a JWT it issued,
// signed with the private key of pub. Without it any JWT buys a token.
func (s *Server) App(id int64, pub *rsa.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appID, s.appKey = id, pub
}

// Install records an installation of the App that may read the
// repositories patterns name ("owner/repo", or "owner/*" for all of an
// owner's): its token reads their diffs and no others.
func (s *Server) Install(id int64, patterns ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.installs == nil {
		s.installs = map[int64][]string{}
	}
	s.installs[id] = patterns
}

// StaticToken is a token that reads every repository's diffs, as one
// person's token would.
func (s *Server) StaticToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.static = token
}

// AddPull serves the diff of pull request number of repo ("owner/repo")
// from base to head, as compare/{base}...{head} and as pulls/{number}.
func (s *Server) AddPull(repo string, number int64, base, head, diff string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pulls == nil {
		s.pulls = map[string]pull{}
	}
	s.pulls[fmt.Sprintf("%s#%d", repo, number)] = pull{base: base, head: head, diff: diff}
}

// HangAfter makes the server, once it has made n more check runs or
// comments, keep the n-th and never answer for it: the caller sees a
// timeout after GitHub acted. The returned channel is closed when it
// hangs.
func (s *Server) HangAfter(n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangs, s.hung = n, make(chan struct{})
	return s.hung
}

// Requests is every request so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.log...)
}

// CheckRuns are the check runs made.
func (s *Server) CheckRuns() []CheckRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]CheckRun, len(s.runs))
	for i, r := range s.runs {
		out[i] = *r
	}
	return out
}

// Comments are the comments made, review comments and conversation ones.
func (s *Server) Comments() []Comment {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Comment, len(s.comments))
	for i, c := range s.comments {
		out[i] = *c
	}
	return out
}

// CommentsOf counts the comments carrying a work's marker.
func (s *Server) CommentsOf(workID string) int {
	n := 0
	for _, c := range s.Comments() {
		if strings.Contains(c.Body, "<!-- assay:work="+workID+" ") {
			n++
		}
	}
	return n
}

func (s *Server) token(w http.ResponseWriter, r *http.Request) {
	jwt, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.Count(jwt, ".") != 2 {
		http.Error(w, `{"message":"A JSON web token could not be decoded"}`, http.StatusUnauthorized)
		return
	}
	s.mu.Lock()
	id, pub := s.appID, s.appKey
	s.mu.Unlock()
	if pub != nil && !signedBy(jwt, id, pub) {
		http.Error(w, `{"message":"'Issuer' claim ('iss') must be an Integer"}`, http.StatusUnauthorized)
		return
	}
	w.WriteHeader(http.StatusCreated)
	writeJSON(w, map[string]any{"token": tokenPrefix + r.PathValue("id"), "expires_at": time.Now().Add(time.Hour).UTC()})
}

// tokenPrefix starts every installation token the server hands out; the
// installation's id follows.
const tokenPrefix = "ghs_fake_"

// signedBy reports whether jwt is an RS256 token issued by app id and
// signed with the key of pub.
func signedBy(jwt string, id int64, pub *rsa.PublicKey) bool {
	parts := strings.Split(jwt, ".")
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return false
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig) != nil {
		return false
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	var claims struct {
		Iss string `json:"iss"`
	}
	return err == nil && json.Unmarshal(raw, &claims) == nil && claims.Iss == strconv.FormatInt(id, 10)
}

// tokenOf is the token a request carries ("token X" or "Bearer X"), "" for
// none.
func tokenOf(r *http.Request) string {
	a := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(a, "token "); ok {
		return t
	}
	t, _ := strings.CutPrefix(a, "Bearer ")
	return t
}

// reads reports whether token may read repo: the static token reads every
// one, an installation's token those its patterns cover.
func (s *Server) reads(token, repo string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.static != "" && token == s.static {
		return true
	}
	id, err := strconv.ParseInt(strings.TrimPrefix(token, tokenPrefix), 10, 64)
	if !strings.HasPrefix(token, tokenPrefix) || err != nil {
		return false
	}
	owner, _, _ := strings.Cut(repo, "/")
	for _, p := range s.installs[id] {
		if p == repo || p == owner+"/*" {
			return true
		}
	}
	return false
}

// diff serves a pull request's diff to a token that may read its
// repository; to any other it is not found, as GitHub hides a private
// repository.
func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	repo := repoOf(r)
	if !s.reads(tokenOf(r), repo) || r.Header.Get("Accept") != "application/vnd.github.diff" {
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, p := range s.pulls {
		if !strings.HasPrefix(key, repo+"#") {
			continue
		}
		if r.PathValue("basehead") == p.base+"..."+p.head || key == repo+"#"+r.PathValue("n") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, p.diff)
			return
		}
	}
	http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
}

func repoOf(r *http.Request) string { return r.PathValue("owner") + "/" + r.PathValue("repo") }

// listRuns lists a commit's check runs a page at a time, as GitHub does
// (per_page 30 unless given, at most 100).
func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	per, _ := strconv.Atoi(r.URL.Query().Get("per_page"))
	page, per = max(page, 1), min(max(per, 1), 100)
	if r.URL.Query().Get("per_page") == "" {
		per = 30
	}
	s.mu.Lock()
	var all []CheckRun
	for _, c := range s.runs {
		if c.Repo == repoOf(r) && c.HeadSHA == r.PathValue("sha") && (r.URL.Query().Get("check_name") == "" || c.Name == r.URL.Query().Get("check_name")) {
			all = append(all, *c)
		}
	}
	s.mu.Unlock()
	from, to := min((page-1)*per, len(all)), min(page*per, len(all))
	writeJSON(w, map[string]any{"total_count": len(all), "check_runs": append([]CheckRun{}, all[from:to]...)})
}

// AddCheckRun records a check run made by someone else on a commit of repo
// (owner/name).
func (s *Server) AddCheckRun(repo string, c CheckRun) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID++
	c.ID, c.Repo = s.nextID, repo
	s.runs = append(s.runs, &c)
}

func (s *Server) createRun(w http.ResponseWriter, r *http.Request) {
	var c CheckRun
	if json.NewDecoder(r.Body).Decode(&c) != nil || c.Name == "" || c.HeadSHA == "" {
		http.Error(w, `{"message":"Invalid request"}`, http.StatusUnprocessableEntity)
		return
	}
	c.Repo = repoOf(r)
	s.mu.Lock()
	s.nextID++
	c.ID = s.nextID
	s.runs = append(s.runs, &c)
	hang := s.made()
	s.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	w.WriteHeader(http.StatusCreated)
	writeJSON(w, c)
}

func (s *Server) editRun(w http.ResponseWriter, r *http.Request) {
	id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
	var in CheckRun
	if json.NewDecoder(r.Body).Decode(&in) != nil {
		http.Error(w, `{"message":"Invalid request"}`, http.StatusUnprocessableEntity)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.runs {
		if c.ID == id && c.Repo == repoOf(r) {
			c.Status, c.Conclusion, c.Output, c.Edits = in.Status, in.Conclusion, in.Output, c.Edits+1
			writeJSON(w, c)
			return
		}
	}
	http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
}

func (s *Server) listComments(review bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
		page, _ := strconv.Atoi(r.URL.Query().Get("page"))
		per, _ := strconv.Atoi(r.URL.Query().Get("per_page"))
		page, per = max(page, 1), min(max(per, 1), 100)
		if r.URL.Query().Get("per_page") == "" {
			per = 30
		}
		s.mu.Lock()
		var all []Comment
		for _, c := range s.comments {
			if c.Review == review && c.Repo == repoOf(r) && c.Number == n {
				all = append(all, *c)
			}
		}
		s.mu.Unlock()
		from, to := min((page-1)*per, len(all)), min(page*per, len(all))
		writeJSON(w, append([]Comment{}, all[from:to]...))
	}
}

func (s *Server) createComment(review bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.ParseInt(r.PathValue("n"), 10, 64)
		var c Comment
		if json.NewDecoder(r.Body).Decode(&c) != nil || c.Body == "" || (review && (c.Path == "" || c.Line <= 0 || c.CommitID == "")) {
			http.Error(w, `{"message":"Validation Failed"}`, http.StatusUnprocessableEntity)
			return
		}
		c.Repo, c.Number, c.Review = repoOf(r), n, review
		s.mu.Lock()
		s.nextID++
		c.ID = s.nextID
		s.comments = append(s.comments, &c)
		hang := s.made()
		s.mu.Unlock()
		if hang {
			<-r.Context().Done()
			return
		}
		w.WriteHeader(http.StatusCreated)
		writeJSON(w, c)
	}
}

func (s *Server) editComment(review bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.PathValue("id"), 10, 64)
		var in Comment
		if json.NewDecoder(r.Body).Decode(&in) != nil || in.Body == "" {
			http.Error(w, `{"message":"Validation Failed"}`, http.StatusUnprocessableEntity)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.comments {
			if c.ID == id && c.Review == review && c.Repo == repoOf(r) {
				c.Body, c.Edits = in.Body, c.Edits+1
				writeJSON(w, c)
				return
			}
		}
		http.Error(w, `{"message":"Not Found"}`, http.StatusNotFound)
	}
}

// made counts one thing made against HangAfter; true means hang. Called
// with mu held.
func (s *Server) made() bool {
	if s.hangs == 0 {
		return false
	}
	s.hangs--
	if s.hangs == 0 {
		close(s.hung)
		return true
	}
	return false
}

func writeJSON(w http.ResponseWriter, v any) {
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
	}
	_ = json.NewEncoder(w).Encode(v)
}
